"""Whether a soak's latencies stayed flat: the requests started in the main level's first window against those
started in its last, first audio (the first audible sample, or the first packet where the bench measured no audible
sample) and each stage of the first packet (loadtest/bench/stages.py), by count, p50 and p95."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from loadtest.bench.metrics import summarize
from loadtest.bench.stages import STAGES

P95_RATIO = 1.25
P95_SLACK_S = 0.005
"""Flat: the last window's p95 at most the first's x P95_RATIO + P95_SLACK_S. A soak looks for drift (a queue, a
cache, an allocator or a stream that grows with the requests served), not for noise: two windows of the same load
differ by chance, by more at p95 than at p50, so a quarter is allowed; the few milliseconds added keep the short
stages (connect, submit, delivery: a millisecond or two each) from being judged on a scheduler's jitter."""
FIRST_AUDIBLE = "first_audible_s"
FIRST_PACKET = "first_packet_s"
NO_STAGES = "the mesh gave no stage data (no request has every lifecycle event): first audio judged alone"

Rows = Sequence[dict]


def window_rows(requests: Rows, duration_s: float, window_s: float) -> tuple[list[dict], list[dict]]:
    """The requests started in [0, window_s) and in [duration_s - window_s, ...) of the level (`started_s`)."""
    timed = [request for request in requests if request.get("started_s") is not None]
    return ([request for request in timed if request["started_s"] < window_s],
            [request for request in timed if request["started_s"] >= duration_s - window_s])


def first_audio_figure(requests: Rows) -> str:
    """`first_audible_s` when the bench measured it for any request, else `first_packet_s`."""
    return FIRST_AUDIBLE if any(request.get(FIRST_AUDIBLE) is not None for request in requests) else FIRST_PACKET


def compare_windows(figure: str, first: Sequence[float], last: Sequence[float]) -> dict:
    """One figure's two windows (count, p50, p95) and whether the last's p95 is within the bound; `flat` is None
    when a window has no value (nothing to judge)."""
    before, after = summarize(first), summarize(last)
    bound = None if before.p95 is None else before.p95 * P95_RATIO + P95_SLACK_S
    flat = None if bound is None or after.p95 is None else after.p95 <= bound
    return {"figure": figure, "first": _window(before), "last": _window(after), "p95_bound_s": bound, "flat": flat}


def latency_verdict(requests: Rows, duration_s: float, window_s: float) -> dict:
    """The latency section of a soak's document: each figure's windows (`window_s`, at most half the level), and
    `flat` when first audio and (where the mesh gave stage data) every stage was judged and within its bound."""
    asked_s, window_s = window_s, min(window_s, duration_s / 2)  # overlapping windows would compare a request twice
    first, last = window_rows(requests, duration_s, window_s)
    figure = first_audio_figure(requests)
    rows = [compare_windows(figure, _values(first, lambda r: r.get(figure)), _values(last, lambda r: r.get(figure)))]
    has_stages = any(request.get("first_packet_stages") for request in requests)
    if has_stages:
        rows += [compare_windows(stage, _values(first, _stage_of(stage)), _values(last, _stage_of(stage)))
                 for stage in STAGES]
    notes = [] if has_stages else [NO_STAGES]
    if window_s < asked_s:
        notes.append(f"the windows are half the level ({window_s:g} s), not {asked_s:g} s, so that they do not "
                     "overlap")
    return {"window_s": window_s, "duration_s": duration_s, "first_window_s": [0.0, window_s],
            "last_window_s": [duration_s - window_s, duration_s], "first_audio": figure,
            "has_stages": has_stages, "rows": rows, "flat": all(row["flat"] is True for row in rows),
            "notes": notes, "ratio": P95_RATIO, "slack_s": P95_SLACK_S}


def markdown_lines(latency: dict) -> list[str]:
    """The latency table: each figure's first and last window, in milliseconds."""
    first, last = latency["first_window_s"], latency["last_window_s"]
    lines = [f"Latency, the requests started in the first window ({first[0]:.0f}-{first[1]:.0f} s of the level) "
             f"against the last ({last[0]:.0f}-{last[1]:.0f} s): flat when the last p95 <= the first's x "
             f"{latency['ratio']:g} + {latency['slack_s'] * 1000:g} ms. "
             f"Verdict: **{'flat' if latency['flat'] else 'NOT flat'}**.", ""]
    lines += [f"Note: {note}." for note in latency["notes"]] + ([""] if latency["notes"] else [])
    lines += ["| figure | first window: n, p50 / p95 | last window: n, p50 / p95 | bound | flat |",
              "|---|---|---|---|---|"]
    for row in latency["rows"]:
        flat = "-" if row["flat"] is None else "yes" if row["flat"] else "NO"
        lines.append(f"| {row['figure']} | {_ms_window(row['first'])} | {_ms_window(row['last'])} | "
                     f"{_ms(row['p95_bound_s'])} | {flat} |")
    return lines


def _values(rows: Rows, pick: Callable[[dict], float | None]) -> list[float]:
    return [value for row in rows if (value := pick(row)) is not None]


def _stage_of(stage: str) -> Callable[[dict], float | None]:
    return lambda request: (request.get("first_packet_stages") or {}).get(stage)


def _window(summary) -> dict:
    return {"count": summary.count, "p50_s": summary.median, "p95_s": summary.p95}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _ms_window(window: dict) -> str:
    return f"{window['count']}, {_ms(window['p50_s'])} / {_ms(window['p95_s'])}"
