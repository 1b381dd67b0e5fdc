"""Latency summaries (milliseconds) and the R3/R1 ratios the reports give side by side."""

from __future__ import annotations

import math

PERCENTILES = (50, 95, 99)


def percentile(sorted_ms: list[float], p: float) -> float:
    """The p-th percentile of already sorted samples (nearest rank: a value that was measured)."""
    if not sorted_ms:
        raise ValueError("no samples")
    rank = max(1, math.ceil(p / 100.0 * len(sorted_ms)))
    return sorted_ms[rank - 1]


def summary(samples_ms: list[float]) -> dict[str, float | int]:
    """n, mean, p50, p95, p99 and max of `samples_ms` (rounded to microseconds)."""
    ordered = sorted(samples_ms)
    if not ordered:
        return {"n": 0}
    found: dict[str, float | int] = {"n": len(ordered), "mean": round(sum(ordered) / len(ordered), 3)}
    for p in PERCENTILES:
        found[f"p{p}"] = round(percentile(ordered, p), 3)
    found["max"] = round(ordered[-1], 3)
    return found


def ratios(candidate: dict[str, float | int], baseline: dict[str, float | int]) -> dict[str, float | None]:
    """candidate/baseline for each percentile (None where the baseline has none or is 0)."""
    found: dict[str, float | None] = {}
    for p in PERCENTILES:
        key = f"p{p}"
        base, value = baseline.get(key), candidate.get(key)
        found[key] = round(float(value) / float(base), 3) if base and value is not None else None
    return found
