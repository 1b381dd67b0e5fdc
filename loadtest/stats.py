"""Distribution summaries: mean, median and tail percentiles of a list of values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class Summary:
    """A distribution in a few numbers (None for each when there were no values).

    Percentiles interpolate linearly between the two nearest ranks (numpy's default, as most published serving
    benchmarks use), so p95 of few values is not simply the largest one.
    """

    count: int
    mean: float | None
    median: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    min: float | None
    max: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Summarize `values` (any order)."""
    if not values:
        return Summary(count=0, mean=None, median=None, p90=None, p95=None, p99=None, min=None, max=None)
    array = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = (float(value) for value in np.percentile(array, PERCENTILES))
    return Summary(count=int(array.size), mean=float(array.mean()), median=p50, p90=p90, p95=p95, p99=p99,
                   min=float(array.min()), max=float(array.max()))
