"""Decode's lanes take a request the moment it is stored, one request at a time into an idle replica: the doorbell
that announces a request can arrive before the stream has stored it, and then the round's census misses it; the
round must still take it (a missed one would wait for the next publish or the fetch timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from nats.aio.msg import Msg

from loadtest.bus.idle_intake import intake
from messages import SynthesisRequest
from messages.streams import REQUESTS_STREAM, BusConfig, request_lanes
from services.bus import submit_request
from services.bus.connection import connect
from services.bus.laned_pull import LanedPull
from services.bus.pull_consumer import Capacity
from tests.support.nats_server import fresh_bus

MODEL = "tiny"
REQUESTS = 100
# A request the rounds missed would wait this long (three times TAKEN_WITHIN_S); an intake whose stop came in the turn
# a reply landed (a cancel Python 3.11 loses) ends within it.
FETCH_TIMEOUT_S = 3.0
TAKEN_WITHIN_S = 1.0
ARRIVAL_GAP_S = 0.05  # requests arrive this far apart, as an open-loop client's do: the replica is idle for each


async def test_every_request_into_an_idle_replica_is_taken_at_once(nats_server, nats_client) -> None:
    await fresh_bus(nats_client.jetstream(), BusConfig(models=(MODEL,), num_partitions=1))
    async with _replicas(nats_server, 1) as (pull,):
        taken = _Intake(pull)
        async with _running([taken]):
            for index in range(REQUESTS):
                request = await _arrive(nats_client, f"idle-{index}")
                assert await asyncio.wait_for(taken.ids.get(), TAKEN_WITHIN_S) == request.id
        # Each request into the idle replica is pulled straight from its lane (no census); the round after the take
        # takes the census, which finds nothing more. Taking it by a census would cost two a request.
        assert pull.num_censuses <= REQUESTS + 2, pull.num_censuses


async def test_idle_replicas_racing_for_each_request_take_each_once_and_at_once(nats_server, nats_client) -> None:
    """Every idle replica pulls the lane its doorbell rang for; one gets the request, the others' pulls linger
    briefly and come back empty, or take the next request: none is lost, none taken twice, none delayed."""
    await fresh_bus(nats_client.jetstream(), BusConfig(models=(MODEL,), num_partitions=1))
    async with _replicas(nats_server, 3) as pulls:
        intakes = [_Intake(pull) for pull in pulls]
        merged: asyncio.Queue[str] = asyncio.Queue()
        forwards = [asyncio.create_task(_forward(intake.ids, merged)) for intake in intakes]
        async with _running(intakes, forwards):
            for index in range(REQUESTS // 2):
                request = await _arrive(nats_client, f"raced-{index}")
                assert await asyncio.wait_for(merged.get(), TAKEN_WITHIN_S) == request.id
        assert merged.empty(), "a request was taken twice"


class _Intake:
    """A decode replica's intake loop over `pull` (`loadtest.bus.idle_intake.intake`): every message taken is queued
    by id and acked."""

    def __init__(self, pull: LanedPull) -> None:
        self.ids: asyncio.Queue[str] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(intake(pull, self.stop, self._taken, fetch_timeout_s=FETCH_TIMEOUT_S))

    async def _taken(self, msg: Msg) -> None:
        await self.ids.put(msg.header.get("Nats-Msg-Id", "") if msg.header else "")


async def _forward(source: asyncio.Queue[str], sink: asyncio.Queue[str]) -> None:
    while True:
        await sink.put(await source.get())


async def _arrive(nats_client, request_id: str) -> SynthesisRequest:
    await asyncio.sleep(ARRIVAL_GAP_S)  # the arrival schedule, not a synchronisation: each take is awaited
    request = SynthesisRequest(id=request_id, model=MODEL, text="One at a time.", seed=1)
    await submit_request(nats_client.jetstream(), request)
    return request


@contextlib.asynccontextmanager
async def _running(intakes: Sequence[_Intake], helpers: Sequence[asyncio.Task] = ()):
    """The intakes and their helper tasks, all ended on the way out."""
    try:
        yield
    finally:
        for intake in intakes:
            intake.stop.set()
        for task in helpers:
            task.cancel()
        await asyncio.gather(*(intake.task for intake in intakes), *helpers, return_exceptions=True)


@contextlib.asynccontextmanager
async def _replicas(nats_server, count: int):
    """`count` replicas' lane pulls, each on its own connection, with room for four requests."""
    connections, pulls = [], []
    try:
        for index in range(count):
            nc = await connect(nats_server.url, f"voxmesh-test-doorbell-{index}", initial_timeout_s=10.0)
            connections.append(nc)
            pull = LanedPull(nc.jetstream(), nc, stream=REQUESTS_STREAM, model=MODEL, lanes=request_lanes(MODEL),
                             capacity=Capacity(4))
            await pull.open()
            pulls.append(pull)
        yield pulls
    finally:
        for pull in pulls:
            await pull.close()
        for nc in connections:
            await nc.close()
