"""Micro-benchmark of the request path's bus operations on one server (R1) against a three-server cluster (R3),
started side by side and interleaved request by request, so both see the same load from the rest of the machine.

Each request makes, through the product's functions (`request_ops`): submit, decode's delivery, claim, a
lifecycle event (awaited, as decode's `emit`), four fenced codes appends (decode's 2, 2, 4, 8-frame ramp) each with its delivery to the vocoder's consumer
and an audio chunk's delivery on core NATS, the CodesEnd, the terminal event. On the cluster the publishing client
is on member 1 and the audio subscriber on member 2 (a gateway and a vocoder on different servers: the audio crosses
a route); where each stream's leader landed is recorded.

`python -m loadtest.bus.bus_ops_bench --iterations 200 --out F.json` (loopback only; bounded by --iterations and
--time-limit).
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
from loadtest.bus.machine import stamp
from loadtest.bus.request_ops import OPS, RequestPath, one_request
from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from services.bus.provision import bucket_stream

WARMUP = 5


async def _leaders(bus: Bus, path: RequestPath) -> dict[str, str | None]:
    found = {}
    for stream in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM, bucket_stream("voxmesh")):
        info = await path.js.stream_info(stream)
        found[stream] = info.cluster.leader if info.cluster is not None else None
    return found


@contextlib.asynccontextmanager
async def opened_paths(buses: dict[str, Bus]):
    """A RequestPath per bus: publisher on its first member, audio subscriber on its second (if it has one)."""
    paths: dict[str, RequestPath] = {}
    clients = []
    try:
        for label, bus in buses.items():
            nc = await bus.client(f"ops-bench-{label}", bus.urls[0])
            audio_nc = await bus.client(f"ops-bench-audio-{label}", bus.urls[min(1, len(bus.urls) - 1)])
            clients += [nc, audio_nc]
            paths[label] = await RequestPath.open(nc, audio_nc)
        yield paths
    finally:
        for path in paths.values():
            await path.close()
        for client in clients:
            await client.close()


async def run(iterations: int, labels: tuple[str, ...], time_limit_s: float, seed: int = 0) -> dict:
    """Start the buses, interleave `iterations` measured requests (after WARMUP) on each, return the report."""
    rng = np.random.default_rng(seed)
    head = stamp()
    async with side_by_side(labels) as buses, opened_paths(buses) as paths:
        samples: dict[str, dict[str, list[float]]] = {label: {} for label in buses}
        for label in buses:
            for _ in range(WARMUP):
                await one_request(paths[label], {}, rng)
        deadline = time.monotonic() + time_limit_s
        done = 0
        for i in range(iterations):
            if time.monotonic() > deadline:
                break
            order = list(buses) if i % 2 == 0 else list(reversed(buses))  # neither bus always goes first
            for label in order:
                await one_request(paths[label], samples[label], rng)
            done += 1
        leaders = {label: await _leaders(buses[label], paths[label]) for label in buses}
    return report(head, samples, done, iterations, leaders)


def report(head: dict, samples: dict[str, dict[str, list[float]]], done: int, asked: int,
           leaders: dict[str, dict[str, str | None]]) -> dict:
    """The JSON document: per bus and operation a latency summary; per operation R3/R1 ratios when both ran."""
    buses = {label: {op: summary(samples[label].get(op, [])) for op in OPS} for label in samples}
    document = {"tool": "bus_ops_bench", **head, "iterations": done, "iterations_asked": asked,
                "unit": "ms", "ops": list(OPS), "buses": buses, "stream_leaders": leaders}
    if "R1" in buses and "R3" in buses:
        document["ratio_r3_over_r1"] = {op: ratios(buses["R3"][op], buses["R1"][op]) for op in OPS}
    return document


def table(document: dict) -> str:
    """p50/p95/p99 per operation and bus, and the ratio, as Markdown."""
    labels = list(document["buses"])
    head = "| op | " + " | ".join(f"{label} p50 / p95 / p99" for label in labels)
    has_ratio = "ratio_r3_over_r1" in document
    lines = [head + (" | R3/R1 p50 / p95 |" if has_ratio else " |"),
             "|---" * (len(labels) + 1 + has_ratio) + "|"]
    for op in document["ops"]:
        cells = []
        for label in labels:
            s = document["buses"][label][op]
            cells.append(f"{s.get('p50', '-')} / {s.get('p95', '-')} / {s.get('p99', '-')}")
        row = f"| {op} | " + " | ".join(cells)
        if has_ratio:
            r = document["ratio_r3_over_r1"][op]
            row += f" | {r['p50']} / {r['p95']}"
        lines.append(row + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="measured requests per bus (default 200)")
    parser.add_argument("--buses", default="R1,R3", help="R1, R3 or both (default R1,R3)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds of measuring at most (300)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON document to write")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be >= 1")
    labels = tuple(label.strip() for label in args.buses.split(",") if label.strip())
    document = asyncio.run(run(args.iterations, labels, args.time_limit))
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(document))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
