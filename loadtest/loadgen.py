"""Load generators: open loop (Poisson arrivals at a fixed rate) and closed loop (a fixed number of clients).

Both are bounded twice: by a number of requests and by a time limit. A request not started by the time limit is
not sent (counted); one in flight at the limit is cut off by its own deadline (recorded as `client_timeout`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter

from loadtest.metrics import StreamRecord

# send(index, deadline) -> the record of request `index`; `deadline` is a perf_counter() time it must end by.
SendFn = Callable[[int, float], Awaitable[StreamRecord]]
DoneFn = Callable[[StreamRecord], None]


class LoadError(ValueError):
    """A load level that cannot run (non-positive rate, concurrency, count or time limit)."""

    code = "invalid_load"


@dataclass(frozen=True, slots=True)
class LevelRun:
    """What a load level produced: the records of the requests sent (by index) and how many were not sent."""

    records: list[StreamRecord]
    num_not_sent: int


def _check(name: str, value: float) -> None:
    if not value > 0:
        raise LoadError(f"{name} must be positive, got {value}")


async def run_open_loop(send: SendFn, *, rate: float, num_requests: int, time_limit_s: float,
                        rng: random.Random, on_done: DoneFn | None = None) -> LevelRun:
    """Start requests at Poisson arrival times (exponential gaps of mean 1/rate, the first at once), whatever
    the mesh's state: the offered load does not slow down when the server does, so queueing shows up as latency."""
    for name, value in (("rate", rate), ("num_requests", num_requests), ("time_limit_s", time_limit_s)):
        _check(name, value)
    start = perf_counter()
    deadline = start + time_limit_s
    tasks: list[asyncio.Task[StreamRecord]] = []
    arrival = start
    async with asyncio.TaskGroup() as group:
        for index in range(num_requests):
            if arrival >= deadline:
                break
            # Waiting for the next scheduled arrival is the load's definition, not a synchronisation.
            await asyncio.sleep(max(0.0, arrival - perf_counter()))
            tasks.append(group.create_task(_send_and_report(send, index, deadline, on_done)))
            arrival += rng.expovariate(rate)
    return LevelRun(records=[task.result() for task in tasks], num_not_sent=num_requests - len(tasks))


async def run_closed_loop(send: SendFn, *, concurrency: int, num_requests: int, time_limit_s: float,
                          on_done: DoneFn | None = None) -> LevelRun:
    """`concurrency` clients, each sending its next request as soon as its previous one ended, until
    `num_requests` have been sent or the time limit has passed."""
    for name, value in (("concurrency", concurrency), ("num_requests", num_requests), ("time_limit_s", time_limit_s)):
        _check(name, value)
    deadline = perf_counter() + time_limit_s
    indices = iter(range(num_requests))  # shared: each client takes the next index
    records: list[StreamRecord] = []

    async def client() -> None:
        for index in indices:
            if perf_counter() >= deadline:
                return
            records.append(await _send_and_report(send, index, deadline, on_done))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, num_requests)):
            group.create_task(client())
    records.sort(key=lambda record: record.index)
    return LevelRun(records=records, num_not_sent=num_requests - len(records))


async def _send_and_report(send: SendFn, index: int, deadline: float, on_done: DoneFn | None) -> StreamRecord:
    record = await send(index, deadline)
    if on_done is not None:
        on_done(record)
    return record
