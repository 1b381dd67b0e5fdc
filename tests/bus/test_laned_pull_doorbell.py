"""Decode's lanes take a request the moment it is stored, one request at a time into an idle replica: the doorbell
that announces a request can arrive before the stream has stored it, and then the round's census misses it; the
round must still take it (a missed one would wait for the next publish or the fetch timeout)."""

from __future__ import annotations

import asyncio

from messages import SynthesisRequest
from messages.streams import REQUESTS_STREAM, BusConfig, request_lanes
from services.bus import submit_request
from services.bus.connection import connect
from services.bus.laned_pull import LanedPull
from services.bus.pull_consumer import Capacity
from tests.support.nats_server import fresh_bus

MODEL = "tiny"
REQUESTS = 100
FETCH_TIMEOUT_S = 10.0  # a request the rounds missed would wait this long
TAKEN_WITHIN_S = 1.0
ARRIVAL_GAP_S = 0.05  # requests arrive this far apart, as an open-loop client's do: the replica is idle for each


async def test_every_request_into_an_idle_replica_is_taken_at_once(nats_server, nats_client) -> None:
    await fresh_bus(nats_client.jetstream(), BusConfig(models=(MODEL,), num_partitions=1))
    nc = await connect(nats_server.url, "voxmesh-test-doorbell", initial_timeout_s=10.0)
    pull = LanedPull(nc.jetstream(), nc, stream=REQUESTS_STREAM, model=MODEL, lanes=request_lanes(MODEL),
                     capacity=Capacity(4))
    await pull.open()
    taken: asyncio.Queue[str] = asyncio.Queue()

    async def intake() -> None:
        while True:
            for msg in await pull.fetch(4, FETCH_TIMEOUT_S):
                await msg.ack()
                await taken.put(msg.header.get("Nats-Msg-Id", "") if msg.header else "")

    running = asyncio.create_task(intake())
    try:
        for index in range(REQUESTS):
            await asyncio.sleep(ARRIVAL_GAP_S)  # the arrival schedule, not a synchronisation: each wait is awaited
            request = SynthesisRequest(id=f"idle-{index}", model=MODEL, text="One at a time.", seed=1)
            await submit_request(nats_client.jetstream(), request)
            assert await asyncio.wait_for(taken.get(), TAKEN_WITHIN_S) == request.id
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await pull.close()
        await nc.close()
