"""What the card did during a device-trace window, process by process and together (services/runtime/device_trace.py).

    python -m loadtest.gpu.device_trace_summary TRACE.json.gz [TRACE.json.gz ...] [--out summary.json] [--top 15]

Each trace is one process's kernels (and copies) over the same few seconds. Printed: for every process, the time its
kernels kept the card busy (the union of their intervals) over the window all traces share, its kernels by total
device time, and, for all processes together, how busy the card was, how much of it two processes ran at once
(none, where contexts are time-sliced), and the idle gaps by length: gaps of a few microseconds are launch
latency, long ones a host that did not feed the card.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_EDGES_US = (5, 20, 100, 1000)


def device_intervals(path: Path) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device activity in one trace, on the clock all traces share."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        document = json.load(handle)
    base_us = document.get("baseTimeNanoseconds", 0) / 1000.0
    return sorted((base_us + event["ts"], base_us + event["ts"] + event.get("dur", 0), event.get("name", "?"))
                  for event in document.get("traceEvents", [])
                  if event.get("ph") == "X" and event.get("cat") in DEVICE_CATEGORIES)


def union(intervals: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Merged intervals clipped to [start, end]."""
    merged: list[list[float]] = []
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, start), min(finish, end)
        if finish <= begin:
            continue
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], finish)
        else:
            merged.append([begin, finish])
    return [(a, b) for a, b in merged]


def total(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def short_name(name: str) -> str:
    """A kernel's name without its template arguments, to group launches of one kernel."""
    return re.sub(r"<.*", "", name.replace("void ", ""))[:90]


def summarize(paths: list[Path], top: int) -> dict:
    traces = {path.name.split(".")[0]: device_intervals(path) for path in paths}
    traces = {name: events for name, events in traces.items() if events}
    if not traces:
        raise ValueError("no device activity in any trace (a CPU-only process, or the window saw no work)")
    start = max(events[0][0] for events in traces.values())
    end = min(max(e[1] for e in events) for events in traces.values())
    window = end - start
    report: dict = {"window_ms": window / 1000, "processes": {}}
    busy_by_process = {}
    for name, events in traces.items():
        busy = union([(a, b) for a, b, _ in events], start, end)
        busy_by_process[name] = busy
        by_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for a, b, kernel in events:
            if a >= start and b <= end:
                by_kernel[short_name(kernel)][0] += 1
                by_kernel[short_name(kernel)][1] += b - a
        ranked = sorted(by_kernel.items(), key=lambda item: -item[1][1])[:top]
        report["processes"][name] = {
            "busy_ms": total(busy) / 1000, "busy_fraction": total(busy) / window,
            "launches": sum(count for count, _ in by_kernel.values()),
            "top_kernels": [{"kernel": k, "count": c, "total_ms": t / 1000} for k, (c, t) in ranked]}
    card = union([span for spans in busy_by_process.values() for span in spans], start, end)
    gaps = [b[0] - a[1] for a, b in zip(card, card[1:])]
    edges = (0, *GAP_EDGES_US, float("inf"))
    report["card"] = {
        "busy_fraction": total(card) / window,
        "two_at_once_ms": (sum(total(s) for s in busy_by_process.values()) - total(card)) / 1000,
        "idle_gaps": [{"from_us": lo, "to_us": hi, "count": sum(lo <= g < hi for g in gaps),
                       "total_ms": sum(g for g in gaps if lo <= g < hi) / 1000} for lo, hi in zip(edges, edges[1:])]}
    return report


def print_report(report: dict) -> None:
    print(f"window {report['window_ms']:.1f} ms; card busy {100 * report['card']['busy_fraction']:.1f}%, "
          f"two processes at once {report['card']['two_at_once_ms']:.2f} ms")
    for gap in report["card"]["idle_gaps"]:
        print(f"  idle gaps {gap['from_us']}-{gap['to_us']} us: {gap['count']} = {gap['total_ms']:.2f} ms")
    for name, process in report["processes"].items():
        print(f"{name}: busy {process['busy_ms']:.1f} ms ({100 * process['busy_fraction']:.1f}%), "
              f"{process['launches']} launches")
        for kernel in process["top_kernels"]:
            print(f"  {kernel['total_ms']:8.2f} ms {kernel['count']:6d}x  {kernel['kernel']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    try:
        report = summarize(args.traces, args.top)
    except (OSError, ValueError, KeyError) as error:
        print(f"device_trace_summary: {error}", file=sys.stderr)
        return 1
    print_report(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
