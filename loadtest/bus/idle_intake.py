"""How long a request waits on REQUESTS when decode is idle: publish -> taken by decode's lane intake (`LanedPull`),
requests one at a time, as one stream or a light open load gives them. One nats-server (R1) on loopback, provisioned
as `voxmesh provision` does; `--replicas N` idle intakes race for every request (each on its own connection).

`python -m loadtest.bus.idle_intake --out F.json [--requests 300 --gap-ms 30 --replicas 1]` (loopback only; bounded by
--requests and the per-request timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.msg import Msg

from loadtest.bus.buses import side_by_side
from loadtest.bus.machine import commit, machine
from messages import SynthesisRequest
from messages.streams import REQUESTS_STREAM, request_lanes
from services.bus import submit_request
from services.bus.laned_pull import LanedPull
from services.bus.pull_consumer import Capacity
from services.bus.stoppable import unless_stopped

MODEL = "tiny"  # what bus_config provisions a request lane for
WARMUP = 20  # the first requests open connections and consumers' state: not counted
TAKE_TIMEOUT_S = 5.0
FETCH_TIMEOUT_S = 3.0  # how long an intake's round waits for work (and the longest it runs on past its stop)


async def measure(requests: int, gap_s: float, replicas: int) -> dict:
    """Latencies (ms) from each publish's return to its delivery out of a `fetch`, and the intakes' rounds."""
    async with side_by_side(("R1",)) as buses:
        bus = buses["R1"]
        client = await bus.client("idle-intake-client")
        taken: asyncio.Queue[float] = asyncio.Queue()
        stop = asyncio.Event()
        pulls, tasks = [], []
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            for index in range(replicas):
                nc = await bus.client(f"idle-intake-{index}")
                stack.push_async_callback(nc.close)
                pull = LanedPull(nc.jetstream(), nc, stream=REQUESTS_STREAM, model=MODEL,
                                 lanes=request_lanes(MODEL), capacity=Capacity(4))
                await pull.open()
                stack.push_async_callback(pull.close)
                pulls.append(pull)
                tasks.append(asyncio.create_task(intake(pull, stop, lambda _msg: taken.put(time.perf_counter()))))
            try:
                latencies = []
                for index in range(WARMUP + requests):
                    await asyncio.sleep(gap_s)  # the arrival schedule; each take is awaited below
                    request = SynthesisRequest(id=f"idle-{index}", model=MODEL, text="One at a time.", seed=1)
                    sent = time.perf_counter()
                    await submit_request(client.jetstream(), request)
                    latencies.append(await asyncio.wait_for(taken.get(), TAKE_TIMEOUT_S) - sent)
                    if index == WARMUP - 1:
                        censuses = sum(pull.num_censuses for pull in pulls)
                        rounds = sum(pull.num_rounds for pull in pulls)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        counted = sorted(latency * 1000 for latency in latencies[WARMUP:])
        return {"requests": requests, "gap_ms": gap_s * 1000, "replicas": replicas,
                "taken_ms": {"p50": round(statistics.median(counted), 3),
                             "p90": round(counted[int(0.9 * (len(counted) - 1))], 3),
                             "p99": round(counted[int(0.99 * (len(counted) - 1))], 3)},
                "censuses_per_request": round((sum(p.num_censuses for p in pulls) - censuses) / requests, 3),
                "rounds_per_request": round((sum(p.num_rounds for p in pulls) - rounds) / requests, 3)}


async def intake(pull: LanedPull, stop: asyncio.Event, on_taken: Callable[[Msg], Awaitable[None]], *,
                 fetch_timeout_s: float = FETCH_TIMEOUT_S) -> None:
    """A decode replica's loop over its lanes until `stop`: `on_taken` hears of each message taken, then it is acked
    (decode acks once it has claimed it). Ended by the event, not by a cancel: Python 3.11's asyncio.wait_for (inside
    nats-py's requests) loses a cancel that comes in the turn its future completes, and a loop that lost one would run
    on; with the event it ends within `fetch_timeout_s`."""
    while not stop.is_set():
        for msg in await unless_stopped(pull.fetch(4, fetch_timeout_s), stop) or []:
            await on_taken(msg)
            await msg.ack()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bus.idle_intake", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=30.0)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.replicas < 1 or args.gap_ms < 0:
        parser.error("--requests and --replicas must be >= 1, --gap-ms >= 0")
    result = asyncio.run(measure(args.requests, args.gap_ms / 1000, args.replicas))
    document = {"commit": commit(), "machine": machine(), **result}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
