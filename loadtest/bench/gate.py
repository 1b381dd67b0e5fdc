"""The public open-loop method's hard gate per load level, and the highest arrival rate that passes it.

A level passes when every request it meant to send completed with audible audio, the audible-clock player never
ran dry (zero underrun events: the buffer emptying at all counts, not only waits over 10 ms), nothing failed, and
nothing was refused for load (HTTP 429, or the same refusal's codes on a socket). An optional bound on the p95 of
the first audible sample (issue 41's target is 50 ms) is a further condition.

`max sustained rps` is the highest rate of an ascending sweep that passed, with every lower rate passing too: the
rate before the first failing one. A sweep stops there (`SweepStop`); a run that ran every level reads it the same
way, so a lucky pass above a failure never counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.bench.metrics import LevelSummary, SloError
from loadtest.bench.workload import LoadError

GATE_RULE = ("all complete and audible, zero underrun events (the audible-clock player's buffer never empties), "
             "no error, no 429")


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """Whether a level passed, and each failed condition by code (`incomplete`, `error`, `http_429`, `underrun`,
    `inaudible`, `p95_over_bound`)."""

    passed: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "reasons": list(self.reasons)}


@dataclass(frozen=True, slots=True)
class Gate:
    """The hard gate.

    Attributes:
        p95_first_audible_bound_s: the p95 of the first audible sample must be within this too (None: no bound).
    """

    p95_first_audible_bound_s: float | None = None

    def __post_init__(self) -> None:
        bound = self.p95_first_audible_bound_s
        if bound is not None and not bound > 0:
            raise SloError(f"the p95 first-audible bound must be positive, got {bound} s")

    def verdict(self, summary: LevelSummary) -> GateVerdict:
        reasons = []
        if summary.num_completed < summary.num_requests or summary.num_requests == 0:
            reasons.append("incomplete")
        if summary.num_failed:
            reasons.append("error")
        if summary.num_overloaded:
            reasons.append("http_429")
        if summary.num_underrun_events:
            reasons.append("underrun")
        if summary.num_inaudible:
            reasons.append("inaudible")
        p95 = summary.first_audible_s.p95
        bound = self.p95_first_audible_bound_s
        if bound is not None and (p95 is None or p95 > bound):
            reasons.append("p95_over_bound")
        return GateVerdict(passed=not reasons, reasons=tuple(reasons))

    def to_dict(self) -> dict:
        return {"rule": GATE_RULE, "p95_first_audible_bound_s": self.p95_first_audible_bound_s}


def sustained_index(passes: Sequence[bool]) -> int | None:
    """Of levels in ascending rate order with these gate outcomes, the index of the last one before the first
    failure (None when the first already failed, or there are none)."""
    last = None
    for index, passed in enumerate(passes):
        if not passed:
            break
        last = index
    return last


@dataclass(slots=True)
class SweepStop:
    """The sweep's stopping rule: it goes on while every level so far passed."""

    stopped_at: float | None = None

    def should_run(self) -> bool:
        return self.stopped_at is None

    def record(self, rate: float, verdict: GateVerdict) -> None:
        if not verdict.passed and self.stopped_at is None:
            self.stopped_at = rate


def rate_ladder(start: float, stop: float, factor: float) -> list[float]:
    """A geometric ladder: start, start x factor, ... up to `stop` (included when reached within rounding)."""
    if not (start > 0 and stop >= start and factor > 1):
        raise LoadError(f"a rate ladder needs 0 < start <= stop and a factor above 1, got {start} {stop} {factor}")
    rates, rate = [], start
    while rate <= stop * (1 + 1e-9):
        rates.append(round(rate, 6))
        rate *= factor
    return rates
