"""A streaming request whose gateway stops hearing from the bus ends its client's stream with one clear error.

Real nats-server (one per test, killed in the test), the stand-in decode/vocoder (tests/support/gateway_standin.py),
the real gateway service under uvicorn, a WebSocket client. The stand-in sends two chunks and then nothing: the rest
of the request is what a partitioned mesh makes where this gateway cannot hear it.

- the gateway's NATS server killed mid-request: the client gets its two chunks, then one `error` with code
  `bus_unavailable`, no sooner than `--bus-outage-s` after the last chunk and within a read of EVENTS after it;
  nothing follows it (`input.done` is answered with `session.done` alone);
- the bus alive but the request's stages silent: the gateway reads EVENTS, which answers, so it never says
  `bus_unavailable`: the supervisor's request timeout ends the request (`timeout`) and the client hears that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import websockets

from messages.streams import BusConfig
from services.bus import EmbeddedNats, connect
from services.gateway.requests.bus_watch import READS_PER_OUTAGE
from tests.support.gateway_fixtures import (WS_PATH, BusHandles, gateway_settings, receive_until_event,
                                             watched_gateway_on)
from tests.support.gateway_fixtures import gateway_model_dir  # noqa: F401 - fixture
from tests.support.gateway_standin import MODEL, NUM_PARTITIONS, Plan, StandInMesh, expected_pcm
from tests.support.nats_server import fresh_bus

pytestmark = pytest.mark.timeout(120)

OUTAGE_S = 2.0
CHUNKS_BEFORE = 2
BODY = {"input": "Words the gateway will not hear the end of.", "voice": "vivian"}


@dataclass
class OwnBus:
    """A nats-server this test may kill, provisioned, with the stand-in mesh serving on it."""

    server: EmbeddedNats
    handles: BusHandles
    standin: StandInMesh

    async def restart(self) -> None:
        """A new server on the killed one's port and store."""
        port = int(self.handles.url.rsplit(":", 1)[1])
        self.server = EmbeddedNats(self.server.store_dir, port=port)
        await asyncio.to_thread(self.server.start)


@pytest.fixture
async def own_bus(tmp_path: Path) -> AsyncIterator[OwnBus]:
    server = EmbeddedNats(tmp_path / "store")
    url = await asyncio.to_thread(server.start)
    config = BusConfig(models=(MODEL,), num_partitions=NUM_PARTITIONS, storage="memory", request_ack_wait_s=5.0)
    nc = await connect(url, "bus-outage-test", initial_timeout_s=10.0)
    standin_nc = await connect(url, "bus-outage-standin", initial_timeout_s=10.0)
    kv = await fresh_bus(nc.jetstream(), config)
    standin_kv = await standin_nc.jetstream().key_value(config.bucket().name)
    standin = StandInMesh(standin_nc, standin_nc.jetstream(), standin_kv)
    await standin.start_replicas()
    standin.start_consumer()
    bus = OwnBus(server, BusHandles(nc, nc.jetstream(), kv, url, config), standin)
    try:
        yield bus
    finally:
        try:
            await standin.stop()
            for client in (standin_nc, nc):
                with contextlib.suppress(OSError):  # a client whose server was killed may find its old socket gone
                    await client.close()
        finally:
            await asyncio.to_thread(bus.server.stop)


@contextlib.asynccontextmanager
async def one_request(bus: OwnBus, model_dir: Path, **settings) -> AsyncIterator[tuple[object, float]]:
    """A gateway on `bus`, one WebSocket request through it; yields (socket, when its last chunk arrived) once the
    client holds the chunks the stand-in sends."""
    async with watched_gateway_on(gateway_settings(bus.handles, model_dir, **settings)) as served:
        url = served.url.replace("http://", "ws://") + WS_PATH
        async with websockets.connect(url, max_size=None) as socket:
            await socket.send(json.dumps(BODY))
            assert json.loads(await socket.recv())["type"] == "audio.start"
            pcm = b"".join([await asyncio.wait_for(socket.recv(), 20.0) for _ in range(CHUNKS_BEFORE)])
            heard_at = time.monotonic()
            assert pcm == expected_pcm(CHUNKS_BEFORE)
            yield socket, heard_at


async def assert_nothing_after_the_error(socket) -> None:
    """`input.done` ends the session: its `session.done` is the next message, so no second end was sent."""
    await socket.send(json.dumps({"type": "input.done"}))
    following = json.loads(await asyncio.wait_for(socket.recv(), 20.0))
    assert following["type"] == "session.done", following


async def test_a_gateway_whose_nats_server_dies_mid_request_ends_the_stream_with_bus_unavailable(own_bus,
                                                                                                gateway_model_dir):
    own_bus.standin.plan = Plan(num_chunks=6, hang_after=CHUNKS_BEFORE)
    async with one_request(own_bus, gateway_model_dir, bus_outage_s=OUTAGE_S) as (socket, heard_at):
        await asyncio.to_thread(own_bus.server.kill)
        pcm, error = await asyncio.wait_for(receive_until_event(socket, "error", "audio.done"), 30.0)
        silent_s = time.monotonic() - heard_at
        assert (pcm, error["type"], error["code"]) == (b"", "error", "bus_unavailable"), error
        assert "resume" in error["message"] and error["request_id"], error["message"]
        # Not before the bound (less the chunk's way from the gateway to this client: audio could still have come),
        # and within one read of EVENTS after it (plus the loaded machine's slack).
        assert OUTAGE_S - 0.2 <= silent_s <= OUTAGE_S + OUTAGE_S / READS_PER_OUTAGE + 3.0, silent_s
        await assert_nothing_after_the_error(socket)
        await own_bus.restart()  # the services then stop as they do, through a server (a drain needs one)


async def test_a_silent_request_on_a_live_bus_is_not_called_a_bus_outage(own_bus, gateway_model_dir):
    own_bus.standin.plan = Plan(num_chunks=6, hang_after=CHUNKS_BEFORE)
    timeout_s = 4 * OUTAGE_S
    async with one_request(own_bus, gateway_model_dir, bus_outage_s=OUTAGE_S,
                           request_timeout_s=timeout_s) as (socket, heard_at):
        pcm, error = await asyncio.wait_for(receive_until_event(socket, "error", "audio.done"), 60.0)
        assert (pcm, error["type"], error["code"]) == (b"", "error", "timeout"), error
        assert time.monotonic() - heard_at >= OUTAGE_S * 2, "silent for twice the bound, never bus_unavailable"
        await assert_nothing_after_the_error(socket)
