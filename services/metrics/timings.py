"""Wall times of one kind of work a service does, kept for its STATS and its /metrics at once.

Cumulative counts per `names.LATENCY_BUCKETS` bound (what a Prometheus histogram needs), their sum, and the last
`WINDOW` times for exact percentiles in STATS, where an operator or a benchmark script reads p50 and p95 directly.
"""

from __future__ import annotations

import bisect
from collections import deque

from services.metrics import names

WINDOW = 1024
"""Times the percentiles are taken over: the recent ones, so a long-running replica reports its present."""


class Timings:
    """Observed wall times in seconds; `snapshot()` is what STATS carries."""

    def __init__(self, bounds: tuple[float, ...] = names.LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: past every bound (+Inf)
        self._recent: deque[float] = deque(maxlen=WINDOW)
        self.count = 0
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self._recent.append(seconds)
        self.count += 1
        self.sum_s += seconds

    def snapshot(self) -> dict:
        """count, sum_s, cumulative [bound, count] pairs (the last bound "+Inf"), and p50/p95/max in milliseconds of
        the recent window (None before the first observation)."""
        cumulative, total = [], 0
        for bound, count in zip((*self.bounds, "+Inf"), self._counts):
            total += count
            cumulative.append([bound, total])
        recent = sorted(self._recent)
        return {"count": self.count, "sum_s": self.sum_s, "buckets": cumulative,
                "p50_ms": _percentile_ms(recent, 0.50), "p95_ms": _percentile_ms(recent, 0.95),
                "max_ms": 1000 * recent[-1] if recent else None}


def _percentile_ms(ordered: list[float], quantile: float) -> float | None:
    """The nearest-rank percentile of sorted seconds, in milliseconds."""
    if not ordered:
        return None
    rank = max(1, -(-int(quantile * 1000) * len(ordered) // 1000))  # ceil(q * n), exact for q in thousandths
    return 1000 * ordered[rank - 1]


def snapshots(parts: dict[str, Timings]) -> dict[str, dict]:
    """Each part's `Timings.snapshot()`, by name: what a service's STATS carries for one kind of work."""
    return {part: timings.snapshot() for part, timings in parts.items()}
