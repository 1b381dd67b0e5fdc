"""A bounded synthetic load on the bus: N streams' codes and audio through the real subjects (`load_level`), swept
upward on one server (R1) and on a three-server cluster (R3) side by side, level by level, until each bus's codes
append p99 is twice its p99 at the lowest level, or the generator cannot keep the streams' rate, or the bounds.

On a machine whose cores the servers and this generator share, the absolute figures say what that machine did; the
R3/R1 ratio at each level is what carries over.

`python -m loadtest.bus.bus_load --out F.json [--start 16 --max-streams 1024 --level-seconds 12]` (loopback only;
bounded by --max-streams, --level-seconds and --time-limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from loadtest.bus.buses import side_by_side
from loadtest.bus.latency import ratios
from loadtest.bus.load_level import Level, run_level
from loadtest.bus.machine import stamp
from loadtest.bus.stream_shape import StreamShape

HEADLINE = "codes_append"  # the publish whose p99 decides the knee
DOUBLING = 2.0
MAX_LAG_P99_MS = 250.0  # the generator is behind the streams' real rate: beyond this, levels measure the generator


def _p99(level: dict, key: str = HEADLINE) -> float | None:
    return level["latency_ms"].get(key, {}).get("p99")


def stop_reason(level: dict, baseline_p99: float | None) -> str | None:
    """Why the sweep of this level's bus ends here (None: go on)."""
    lag = level["latency_ms"].get("generator_lag", {}).get("p99")
    if lag is not None and lag > MAX_LAG_P99_MS:
        return f"generator behind the streams' rate (lag p99 {lag} ms > {MAX_LAG_P99_MS} ms)"
    p99 = _p99(level)
    if baseline_p99 and p99 is not None and p99 >= DOUBLING * baseline_p99:
        return f"{HEADLINE} p99 {p99} ms >= {DOUBLING} x the lowest level's {baseline_p99} ms"
    return None


def planned_levels(start: int, max_streams: int) -> list[int]:
    """start, 2 start, 4 start ... up to max_streams."""
    levels, n = [], start
    while n <= max_streams:
        levels.append(n)
        n *= 2
    return levels


async def sweep(levels: list[int], seconds: float, warmup_s: float, shape: StreamShape, time_limit_s: float,
                labels: tuple[str, ...] = ("R1", "R3"), keep_going: bool = False) -> dict:
    """Each level on each bus in turn (the bus going first alternating), until every bus has stopped; with
    `keep_going`, past the doubling too (recorded as the knee), until the generator lags or the bounds end it."""
    head = stamp()
    deadline = time.monotonic() + time_limit_s
    results: dict[str, list[dict]] = {label: [] for label in labels}
    stopped: dict[str, str] = {}
    knees: dict[str, str] = {}
    async with side_by_side(labels) as buses:
        for index, streams in enumerate(levels):
            order = list(buses) if index % 2 == 0 else list(reversed(buses))
            for label in order:
                if label in stopped:
                    continue
                if time.monotonic() + seconds > deadline:
                    stopped.setdefault(label, "time limit")
                    continue
                level = await run_level(Level(buses[label], streams, seconds, shape, warmup_s))
                results[label].append(level)
                print(f"{label} {streams:5d} streams: {HEADLINE} p50 {level['latency_ms'][HEADLINE].get('p50')} "
                      f"p99 {_p99(level)} ms, lag p99 {level['latency_ms'].get('generator_lag', {}).get('p99')} ms, "
                      f"servers {level['servers']['cpu_cores']} cores", file=sys.stderr, flush=True)
                reason = stop_reason(level, _p99(results[label][0]))
                if reason is not None and "generator" not in reason and label not in knees:
                    knees[label] = f"at {streams} streams: {reason}"
                if reason is not None and (not keep_going or "generator" in reason):
                    stopped[label] = reason
            if len(stopped) == len(buses):
                break
    return report(head, results, stopped, shape, seconds, warmup_s, knees)


def report(head: dict, results: dict[str, list[dict]], stopped: dict[str, str], shape: StreamShape,
           seconds: float, warmup_s: float, knees: dict[str, str] | None = None) -> dict:
    """The JSON document: every level per bus, where and why each sweep stopped, the highest level each bus held
    under twice its lowest p99, and R3/R1 ratios at the levels both ran."""
    sustained = {}
    for label, levels in results.items():
        base = _p99(levels[0]) if levels else None
        held = []
        for level in levels:  # the levels before the first that doubled the p99 or lagged
            if not base or stop_reason(level, base) is not None:
                break
            held.append(level["streams"])
        sustained[label] = max(held) if held else None
    document = {"tool": "bus_load", **head, "headline": HEADLINE, "doubling": DOUBLING,
                "level_seconds": seconds, "warmup_seconds": warmup_s,
                "stream_shape": {"frames_per_request": shape.frames, "chunk_frames": shape.chunk_sizes(),
                                 "audio_seconds_per_request": shape.seconds},
                "levels": results, "stopped": stopped, "knees": knees or {}, "sustained_streams": sustained}
    if "R1" in results and "R3" in results:
        r1 = {lv["streams"]: lv for lv in results["R1"]}
        document["ratio_r3_over_r1"] = [
            {"streams": lv["streams"],
             **{key: ratios(lv["latency_ms"].get(key, {}), r1[lv["streams"]]["latency_ms"].get(key, {}))
                for key in (HEADLINE, "codes_delivery", "codes_to_audio", "audio_delivery")},
             "server_cpu": round(lv["servers"]["cpu_cores"] / r1[lv["streams"]]["servers"]["cpu_cores"], 3)
             if r1[lv["streams"]]["servers"]["cpu_cores"] else None}
            for lv in results["R3"] if lv["streams"] in r1]
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=int, default=16, help="streams at the lowest level (default 16)")
    parser.add_argument("--max-streams", type=int, default=1024, help="highest level at most (default 1024)")
    parser.add_argument("--level-seconds", type=float, default=12.0, help="seconds per level and bus (default 12)")
    parser.add_argument("--warmup-seconds", type=float, default=3.0, help="unmeasured start of each level (3)")
    parser.add_argument("--frames", type=int, default=100, help="frames per request (default 100: 8 s of audio)")
    parser.add_argument("--buses", default="R1,R3", help="R1, R3 or both (default R1,R3)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole sweep (600)")
    parser.add_argument("--keep-going", action="store_true",
                        help="sweep past the doubling (recorded as the knee) until the generator lags or the bounds")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.start < 1 or args.max_streams < args.start or args.level_seconds <= args.warmup_seconds:
        parser.error("need 1 <= --start <= --max-streams and --level-seconds > --warmup-seconds")
    labels = tuple(label.strip() for label in args.buses.split(",") if label.strip())
    document = asyncio.run(sweep(planned_levels(args.start, args.max_streams), args.level_seconds,
                                 args.warmup_seconds, StreamShape(frames=args.frames), args.time_limit, labels,
                                 args.keep_going))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps({"sustained_streams": document["sustained_streams"], "stopped": document["stopped"]}))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
