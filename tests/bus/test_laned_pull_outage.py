"""Decode's lane census when the bus cannot answer it (a stream leader's election, a server gone): a round comes back
empty instead of ending decode's intake, and once the server is back the next rounds take the request."""

from __future__ import annotations

import asyncio

from messages import SynthesisRequest, subjects
from messages.streams import REQUESTS_STREAM, BusConfig, request_lanes
from services.bus import submit_request
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.laned_pull import LanedPull
from services.bus.listen_ports import free_listen_port
from services.bus.pull_consumer import Capacity
from tests.support.nats_server import fresh_bus

MODEL = "tiny"
ROUND_S = 0.3
BACK_TIMEOUT_S = 30.0


async def test_a_census_the_bus_cannot_answer_costs_a_round_not_the_intake(tmp_path) -> None:
    server = EmbeddedNats(tmp_path / "store", port=free_listen_port(), name="voxmesh-lanes")
    await asyncio.to_thread(server.start)
    url = server.url
    nc = await connect(url, "voxmesh-test-lanes", initial_timeout_s=10.0)
    try:
        await fresh_bus(nc.jetstream(), BusConfig(models=(MODEL,), num_partitions=1))
        pull = LanedPull(nc.jetstream(timeout=1.0), nc, stream=REQUESTS_STREAM, model=MODEL,
                         lanes=request_lanes(MODEL), capacity=Capacity(4))
        await pull.open()
        server.kill()
        assert await pull.fetch(4, ROUND_S) == [], "no census, nothing taken, and no error"
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)  # the same port and store: the client reconnects
        request = SynthesisRequest(id="after-outage", model=MODEL, text="Back again.", seed=1)
        await asyncio.wait_for(submit_request(nc.jetstream(), request), BACK_TIMEOUT_S)

        async def taken() -> list:
            while not (got := await pull.fetch(4, ROUND_S)):
                pass  # each empty round waited for a doorbell, a freed seat or ROUND_S
            return got

        (message,) = await asyncio.wait_for(taken(), BACK_TIMEOUT_S)
        assert message.subject == subjects.request_for(MODEL, "interactive", "")
        await pull.close()
    finally:
        await nc.close()
        await asyncio.to_thread(server.stop)
