"""A client that reads its audio slower than the mesh makes it, on the real mesh (`voxmesh up`: decode, vocoder,
nats-server, the tiny checkpoint) with a second gateway in the test's process (so its state can be awaited): the
gateway holds at most `--client-buffer-s` of audio for it, then cancels the request in every stage (decode ends its
codes, the vocoder its terminal, both `slow_client`) and tells the client so; a stream beside it never waits."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from messages import Failed
from messages.audio_format import SAMPLES_PER_FRAME
from messages.errors import ErrorCode, Stage
from tests.support.gateway_fixtures import gateway_settings_on_mesh, watched_gateway_on
from tests.support.mesh import run_mesh
from tests.support.http_client import sample, scrape
from tests.support.mesh_client import codes_on_bus, events_of
from tests.support.ws_client import PATH, WsClient, one_shot

pytestmark = pytest.mark.timeout(300)

SMALL_BUFFERS = 4096  # bytes of kernel buffer each way: a client that stops reading holds the sends at once
SLOW_FRAMES = 400
HEALTHY = {"input": "Never kept waiting.", "voice": "eric", "seed": 11, "max_new_tokens": 32, "ignore_eos": True}


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    # The healthy stream's audio is compared bit for bit: each codec chunk decoded alone (see test_ws_bad_input).
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("slow-reader"),
                  env={"VOXMESH_CODEC_BATCHING": "off"}) as running:
        yield running



@contextlib.asynccontextmanager
async def reader_that_stops(url: str) -> AsyncIterator[WsClient]:
    """A WebSocket client with a small receive buffer that holds at most one message unread: when the test stops
    reading, the gateway's sends to it stop a few kB later."""
    address = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFERS)
    sock.connect((address.hostname, address.port))
    async with websockets.connect(f"ws://{address.netloc}{PATH}", sock=sock, max_queue=1, max_size=None) as ws:
        yield WsClient(ws)


async def test_a_slow_reader_is_cancelled_in_every_stage_and_a_stream_beside_never_waits(mesh, tiny_checkpoint):
    settings = gateway_settings_on_mesh(mesh.nats_url, tiny_checkpoint, client_buffer_s=1.0)
    async with watched_gateway_on(settings, send_buffer_bytes=SMALL_BUFFERS) as served:
        reference = await one_shot(served.url, HEALTHY)
        async with reader_that_stops(served.url) as slow:
            await slow.socket.send(json.dumps({"input": "A long answer that nobody reads as it comes.",
                                               "voice": "ryan", "seed": 2, "max_new_tokens": SLOW_FRAMES,
                                               "ignore_eos": True}))
            request_id = (await slow.until("audio.start")).event["request_id"]
            # From here the slow client reads nothing until its request has ended everywhere.
            beside = await one_shot(served.url, HEALTHY)
            events = await events_of(mesh.nats_url, request_id)
            _, codes_end = await codes_on_bus(mesh.nats_url, request_id)
            late = await slow.until("error", "audio.done")  # reading again: the audio the buffers held, the error
            await slow.send("session.update", seed=3)
            still = await slow.until("session.updated", "error")
        await served.gateway.synthesizer.supervisor.live.until_none()
        async with httpx.AsyncClient(base_url=served.url) as client:
            metrics = scrape((await client.get("/metrics")).text)
    assert beside == reference, "the stream beside the slow reader was disturbed"
    terminal = events[-1]
    assert isinstance(terminal, Failed) and (terminal.code, terminal.stage) == (ErrorCode.SLOW_CLIENT, Stage.GATEWAY)
    assert terminal.frames < SLOW_FRAMES, "the vocoder stopped before the whole request"
    assert codes_end.reason == "failed" and codes_end.error.code == ErrorCode.SLOW_CLIENT, codes_end
    assert codes_end.total_frames < SLOW_FRAMES, "decode stopped generating it"
    error = late.event
    assert (error["type"], error["code"], error["request_id"], error["stage"]) == ("error", "slow_client", request_id,
                                                                                  "gateway"), error
    assert "--client-buffer-s" in error["message"]
    assert 0 < len(late.pcm) < 2 * SAMPLES_PER_FRAME * terminal.frames, "what the buffers held, not all made"
    assert still.event["type"] == "session.updated", "the socket stays open"
    assert sample(metrics, "voxmesh_requests_total", outcome="failed", code="slow_client") == 1
    assert sample(metrics, "voxmesh_live_requests") == 0
