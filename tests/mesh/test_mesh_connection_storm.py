"""Many connections opened and dropped at once, on the real mesh (`voxmesh up`: decode, vocoder, nats-server, the
tiny checkpoint) with a second gateway in the test's process, so its state can be awaited: WebSockets whose request
streams, whose request is still being submitted, or that never said a word; HTTP responses cut mid-body; half-sent
HTTP requests. All on loopback, bounded in count. Afterwards the mesh serves a stream exactly as before, and the
gateway lets go of everything: its live requests return to 0 (awaited), its NATS subscriptions and gauges to where
they were."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from tests.support.gateway_fixtures import gateway_settings_on_mesh, watched_gateway_on
from tests.support.mesh import run_mesh
from tests.support.http_client import sample, scrape
from tests.support.ws_client import PATH, WAIT_S, one_shot

pytestmark = pytest.mark.timeout(300)

PER_KIND = 8  # connections of each kind below: 40 in all
# Long enough to be running until it is cancelled (the runaway guard allows 60 + 4 frames a character).
LONG = {"voice": "vivian", "max_new_tokens": 400, "ignore_eos": True}
HEALTHY = {"input": "Still serving after the storm.", "voice": "eric", "seed": 11, "max_new_tokens": 32,
           "ignore_eos": True}


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    # The healthy stream's audio is compared bit for bit: each codec chunk decoded alone (see test_ws_bad_input).
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("storm"),
                  env={"VOXMESH_CODEC_BATCHING": "off"}) as running:
        yield running



async def ws_streaming(url: str, n: int) -> asyncio.BaseTransport:
    """A socket whose request streams audio when it is dropped."""
    socket = await websockets.connect(url.replace("http", "ws") + PATH, max_size=None)
    await socket.send(json.dumps({"input": f"Storm number {n} keeps talking, and talking, and talking, long after "
                                           "anyone listens.", **LONG}))
    while isinstance(message := await asyncio.wait_for(socket.recv(), WAIT_S), str):  # audio.start
        assert json.loads(message)["type"] == "audio.start", message
    return socket.transport


async def ws_submitting(url: str, n: int) -> asyncio.BaseTransport:
    """A socket dropped right after its text went out: its request may be anywhere between admission and decode."""
    socket = await websockets.connect(url.replace("http", "ws") + PATH, max_size=None)
    await socket.send(json.dumps({"type": "input.text", "text": f"Storm number {n} just said this.\n"}))
    return socket.transport


async def ws_silent(url: str, _n: int) -> asyncio.BaseTransport:
    return (await websockets.connect(url.replace("http", "ws") + PATH)).transport


async def http_streaming(url: str, n: int) -> asyncio.BaseTransport:
    """An HTTP response with `stream_format: audio`, dropped after its first body bytes."""
    reader, writer = await asyncio.open_connection(urlsplit(url).hostname, urlsplit(url).port)
    body = json.dumps({"input": f"Storm number {n} over HTTP keeps talking, and talking, long after anyone "
                                "listens.", "stream_format": "audio", "response_format": "pcm", **LONG}).encode()
    writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    assert head.startswith(b"HTTP/1.1 200"), head
    await asyncio.wait_for(reader.read(1), WAIT_S)
    return writer.transport


async def http_half_sent(url: str, _n: int) -> asyncio.BaseTransport:
    """An HTTP request whose body never arrives in full."""
    _, writer = await asyncio.open_connection(urlsplit(url).hostname, urlsplit(url).port)
    writer.write(b'POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Length: 500\r\n\r\n{"input": "Sto')
    await writer.drain()
    return writer.transport


KINDS = [ws_streaming, ws_submitting, ws_silent, http_streaming, http_half_sent]


async def test_a_connection_storm_leaves_nothing_behind_and_the_mesh_keeps_serving(mesh, tiny_checkpoint):
    settings = gateway_settings_on_mesh(mesh.nats_url, tiny_checkpoint, resume_window_s=0.5)
    async with watched_gateway_on(settings) as served:
        synthesizer = served.gateway.synthesizer
        reference = await one_shot(served.url, HEALTHY)
        await synthesizer.supervisor.live.until_none()
        subscriptions_before = len(synthesizer.nc._subs)  # nats-py's own table of this connection's subscriptions
        transports = await asyncio.gather(*(kind(served.url, n) for kind in KINDS for n in range(PER_KIND)))
        live_in_storm = len(synthesizer.supervisor.live)
        for transport in transports:
            transport.abort()  # all dropped at once, without a close handshake
        after = await one_shot(served.url, HEALTHY)
        through_mesh_gateway = await one_shot(mesh.gateway_url, HEALTHY)
        await asyncio.wait_for(synthesizer.supervisor.live.until_none(), WAIT_S)
        subscriptions_after = len(synthesizer.nc._subs)
        async with httpx.AsyncClient(base_url=served.url) as client:
            metrics = scrape((await client.get("/metrics")).text)
    assert live_in_storm >= 2 * PER_KIND, "the streaming sockets' requests were live when the storm hit"
    assert after == through_mesh_gateway == reference, "the mesh serves exactly as before the storm"
    assert subscriptions_after == subscriptions_before, "every request's subscriptions were released"
    assert sample(metrics, "voxmesh_live_requests") == 0 and sample(metrics, "voxmesh_active_streams") == 0
    ended = sum(value for (name, labels), value in metrics.items() if name == "voxmesh_requests_total")
    assert ended >= 2 * PER_KIND + 3, "each admitted request was counted once it ended"
