"""Micro-benchmark of the request path's bus operations on one server (R1) against a three-server cluster (R3, R3L),
started side by side and interleaved request by request, so all see the same load from the rest of the machine.

Each request makes, through the product's functions (`request_ops`): submit, decode's delivery, claim, a
lifecycle event (awaited, as decode's `emit`), four fenced codes appends (decode's 2, 2, 4, 8-frame ramp) each
with its delivery to the vocoder's consumer and an audio chunk's delivery on core NATS, the CodesEnd, the terminal
event. On the cluster every leader the bench
uses is moved to member 1; R3's publishing client is on member 2 (a call crosses a route to its leader, as it does
for two clients in three when leaders fall where they may), R3L's on member 1 (the quorum's cost alone); the audio
subscriber is on member 3 (a gateway and a vocoder on different servers: the audio crosses a route). Where each
leader ended up is recorded.

`python -m loadtest.bus.bus_ops_bench --iterations 200 --out F.json [--paths R1,R3,R3L]` (loopback only; bounded
by --iterations and --time-limit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from loadtest.bus.buses import Bus, side_by_side
from loadtest.bus.latency import ratios, summary
from loadtest.bus.leaders import move_leader
from loadtest.bus.machine import stamp
from loadtest.bus.request_ops import OPS, PARTITION, REQUESTS_CONSUMER, RequestPath, one_request
from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM, codes_consumer
from services.bus.provision import bucket_stream

WARMUP = 5

PATHS = ("R1", "R3", "R3L")
"""R1: one server. R3: the cluster, the publishing client on a member that leads nothing (every JetStream call
crosses a route to its leader). R3L: the same cluster, every leader the bench uses moved to the publishing client's
member (the quorum's round trip alone)."""
LEADER_MEMBER, REMOTE_MEMBER, AUDIO_MEMBER = 0, 1, 2


async def _leaders(path: RequestPath) -> dict[str, str | None]:
    found = {}
    for stream in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM, bucket_stream("voxmesh")):
        info = await path.js.stream_info(stream)
        found[stream] = info.cluster.leader if info.cluster is not None else None
    for stream, consumer in ((REQUESTS_STREAM, REQUESTS_CONSUMER), (CODES_STREAM, codes_consumer(PARTITION))):
        info = await path.js.consumer_info(stream, consumer)
        found[consumer] = info.cluster.leader if info.cluster is not None else None
    return found


async def _lead_from(bus: Bus, member: int) -> None:
    """Every stream and consumer leader the bench uses onto `member` (bounded; `_leaders` records the outcome)."""
    nc = await bus.client("ops-bench-placement", bus.urls[member])
    try:
        name = bus.servers[member].name
        for stream in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM, bucket_stream("voxmesh")):
            await move_leader(nc, name, stream)
        for stream, consumer in ((REQUESTS_STREAM, REQUESTS_CONSUMER),
                                 (CODES_STREAM, codes_consumer(PARTITION))):
            await move_leader(nc, name, stream, consumer)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def opened_paths(buses: dict[str, Bus], labels: tuple[str, ...]):
    """A RequestPath per label: R1's all on its server; on the cluster (leaders moved to member 1 first), R3's
    publisher on member 2, R3L's on member 1, each audio subscriber on member 3."""
    members = {"R1": (0, 0), "R3": (REMOTE_MEMBER, AUDIO_MEMBER), "R3L": (LEADER_MEMBER, AUDIO_MEMBER)}
    paths: dict[str, RequestPath] = {}
    clients = []
    try:
        if "R3" in buses:
            await _lead_from(buses["R3"], LEADER_MEMBER)
        for label in labels:
            bus = buses["R1" if label == "R1" else "R3"]
            publisher, audio = members[label]
            nc = await bus.client(f"ops-bench-{label}", bus.urls[publisher])
            audio_nc = await bus.client(f"ops-bench-audio-{label}", bus.urls[audio])
            clients += [nc, audio_nc]
            paths[label] = await RequestPath.open(nc, audio_nc)
        yield paths
    finally:
        for path in paths.values():
            await path.close()
        for client in clients:
            await client.close()


async def run(iterations: int, labels: tuple[str, ...], time_limit_s: float, seed: int = 0) -> dict:
    """Start the buses, interleave `iterations` measured requests (after WARMUP) on each path, return the report."""
    unknown = set(labels) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown path(s) {sorted(unknown)}: use {', '.join(PATHS)}")
    rng = np.random.default_rng(seed)
    head = stamp()
    bus_labels = tuple(label for label in ("R1", "R3") if label in labels or (label == "R3" and "R3L" in labels))
    async with side_by_side(bus_labels) as buses, opened_paths(buses, labels) as paths:
        samples: dict[str, dict[str, list[float]]] = {label: {} for label in labels}
        for label in labels:
            for _ in range(WARMUP):
                await one_request(paths[label], {}, rng)
        deadline = time.monotonic() + time_limit_s
        done = 0
        for i in range(iterations):
            if time.monotonic() > deadline:
                break
            order = list(labels) if i % 2 == 0 else list(reversed(labels))  # no path always goes first
            for label in order:
                await one_request(paths[label], samples[label], rng)
            done += 1
        leaders = {label: await _leaders(paths[label]) for label in labels}
    return report(head, samples, done, iterations, leaders)


def report(head: dict, samples: dict[str, dict[str, list[float]]], done: int, asked: int,
           leaders: dict[str, dict[str, str | None]]) -> dict:
    """The JSON document: per path and operation a latency summary; per operation each cluster path's ratio to R1
    when both ran."""
    buses = {label: {op: summary(samples[label].get(op, [])) for op in OPS} for label in samples}
    document = {"tool": "bus_ops_bench", **head, "iterations": done, "iterations_asked": asked,
                "unit": "ms", "ops": list(OPS), "paths": {label: PATH_NOTES[label] for label in buses},
                "buses": buses, "leaders": leaders}
    for label, key in (("R3", "ratio_r3_over_r1"), ("R3L", "ratio_r3l_over_r1")):
        if "R1" in buses and label in buses:
            document[key] = {op: ratios(buses[label][op], buses["R1"][op]) for op in OPS}
    return document


PATH_NOTES = {"R1": "one server", "R3": "3-server cluster, 3 replicas; the publishing client on a member leading "
                                        "nothing", "R3L": "the same cluster; every leader on the client's member"}


def table(document: dict) -> str:
    """p50/p95/p99 per operation and path, and each cluster path's ratio to R1, as Markdown."""
    labels = list(document["buses"])
    ratio_keys = [key for key in ("ratio_r3_over_r1", "ratio_r3l_over_r1") if key in document]
    head = "| op | " + " | ".join(f"{label} p50 / p95 / p99" for label in labels)
    head += "".join(f" | {key[6:].replace('_over_', '/').upper()} p50 / p95" for key in ratio_keys)
    lines = [head + " |", "|---" * (len(labels) + 1 + len(ratio_keys)) + "|"]
    for op in document["ops"]:
        cells = []
        for label in labels:
            s = document["buses"][label][op]
            cells.append(f"{s.get('p50', '-')} / {s.get('p95', '-')} / {s.get('p99', '-')}")
        row = f"| {op} | " + " | ".join(cells)
        for key in ratio_keys:
            r = document[key][op]
            row += f" | {r['p50']} / {r['p95']}"
        lines.append(row + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="measured requests per bus (default 200)")
    parser.add_argument("--paths", default="R1,R3,R3L", help="of R1, R3, R3L (default all three)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds of measuring at most (300)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON document to write")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be >= 1")
    labels = tuple(label.strip() for label in args.paths.split(",") if label.strip())
    document = asyncio.run(run(args.iterations, labels, args.time_limit))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(document))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
