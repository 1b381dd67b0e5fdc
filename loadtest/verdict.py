"""Headline figures of a sweep: the highest open-loop rate sustained, and ratios between two targets."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.aggregate import LevelSummary
from loadtest.runner import LevelResult


def is_sustained(summary: LevelSummary, p95_first_packet_bound_s: float) -> bool:
    """Every request sent and completed, no playback gap in any stream, and p95 first packet within the bound."""
    p95 = summary.first_packet_s.p95
    return (summary.num_completed > 0 and summary.num_failed == 0 and summary.num_not_sent == 0
            and summary.num_gaps == 0 and p95 is not None and p95 <= p95_first_packet_bound_s)


def max_sustained_rate(results: Sequence[LevelResult], p95_first_packet_bound_s: float) -> float | None:
    """The highest open-loop arrival rate that was sustained (None when none was, or no open level ran)."""
    rates = [result.level.load for result in results
             if result.level.mode == "open" and is_sustained(result.summary, p95_first_packet_bound_s)]
    return max(rates, default=None)


# (name in the report, how to read it from a summary)
_COMPARED = {
    "requests_per_s": lambda s: s.requests_per_s,
    "audio_s_per_s": lambda s: s.audio_s_per_s,
    "goodput_per_s": lambda s: s.goodput_per_s,
    "continuous_share": lambda s: s.continuous_share,
    "first_packet_p50_s": lambda s: s.first_packet_s.median,
    "first_packet_p95_s": lambda s: s.first_packet_s.p95,
    "latency_p95_s": lambda s: s.latency_s.p95,
    "rtf_median": lambda s: s.rtf.median,
}


def ratio(candidate: float | None, baseline: float | None) -> float | None:
    """candidate / baseline, None when either is missing or the baseline is zero."""
    if candidate is None or baseline is None or baseline == 0:
        return None
    return candidate / baseline


def compare_levels(baseline: Sequence[LevelResult], candidate: Sequence[LevelResult]) -> list[dict]:
    """Per level (same order on both sides): each compared figure of both targets and candidate/baseline."""
    rows = []
    for base, cand in zip(baseline, candidate, strict=True):
        figures = {}
        for name, read in _COMPARED.items():
            a, b = read(base.summary), read(cand.summary)
            figures[name] = {"baseline": a, "candidate": b, "ratio": ratio(b, a)}
        rows.append({"level": base.level.to_dict(), "figures": figures})
    return rows
