"""What one load level did: throughput, latency distributions, continuity and goodput under an SLO."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.metrics import RequestMetrics, StreamRecord, request_metrics
from loadtest.stats import Summary, summarize


class SloError(ValueError):
    """An SLO that cannot be met by construction (non-positive first-packet bound)."""

    code = "invalid_slo"


@dataclass(frozen=True, slots=True)
class Slo:
    """The service level a request must meet to count towards goodput.

    Attributes:
        first_packet_s: the first packet must arrive within this many seconds.
        require_continuous: the stream must play without a gap (an underrun over 10 ms).
    """

    first_packet_s: float = 0.5
    require_continuous: bool = True

    def __post_init__(self) -> None:
        if not self.first_packet_s > 0:
            raise SloError(f"the SLO's first-packet bound must be positive, got {self.first_packet_s} s")

    def is_met_by(self, metrics: RequestMetrics) -> bool:
        if not metrics.ok or metrics.first_packet_s is None or metrics.first_packet_s > self.first_packet_s:
            return False
        return metrics.is_continuous or not self.require_continuous

    def to_dict(self) -> dict:
        return {"first_packet_s": self.first_packet_s, "require_continuous": self.require_continuous}


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """One load level's figures. Rates divide by `wall_s`, from the first request's start to the last one's end.

    Distributions (first packet, latency, RTF, max underrun) cover completed requests; chunk intervals pool every
    interval of every completed request. `continuous_share` is over completed requests; goodput counts requests
    that completed within the SLO, so a failed request lowers goodput but not continuity.
    """

    num_requests: int
    num_completed: int
    num_failed: int
    num_not_sent: int
    errors: dict[str, int]
    wall_s: float
    requests_per_s: float
    audio_s: float
    audio_s_per_s: float
    first_packet_s: Summary
    latency_s: Summary
    rtf: Summary
    chunk_interval_s: Summary
    max_underrun_s: Summary
    num_gaps: int
    continuous_share: float | None
    goodput_count: int
    goodput_share: float | None
    goodput_per_s: float

    def to_dict(self) -> dict:
        fields = {name: getattr(self, name) for name in self.__slots__}
        return {name: value.to_dict() if isinstance(value, Summary) else value for name, value in fields.items()}


def summarize_level(records: Sequence[StreamRecord], slo: Slo, num_not_sent: int = 0) -> LevelSummary:
    """Summarize the requests of one level; `num_not_sent` counts requests the level's time bound cut off."""
    metrics = [request_metrics(record) for record in records]
    done = [m for m in metrics if m.ok]
    wall_s = _wall_s(records)
    audio_s = sum(m.audio_s for m in done)
    goodput = sum(1 for m in metrics if slo.is_met_by(m))
    issued = len(records) + num_not_sent
    return LevelSummary(
        num_requests=issued, num_completed=len(done), num_failed=len(metrics) - len(done), num_not_sent=num_not_sent,
        errors=dict(Counter(m.error_code for m in metrics if m.error_code is not None)), wall_s=wall_s,
        requests_per_s=_rate(len(done), wall_s), audio_s=audio_s, audio_s_per_s=_rate(audio_s, wall_s),
        first_packet_s=summarize([m.first_packet_s for m in done if m.first_packet_s is not None]),
        latency_s=summarize([m.latency_s for m in done]),
        rtf=summarize([m.rtf for m in done if m.rtf is not None]),
        chunk_interval_s=summarize([interval for m in done for interval in m.chunk_intervals_s]),
        max_underrun_s=summarize([m.player.max_underrun_s for m in done]),
        num_gaps=sum(m.player.num_gaps for m in done),
        continuous_share=sum(1 for m in done if m.is_continuous) / len(done) if done else None,
        goodput_count=goodput, goodput_share=goodput / issued if issued else None,
        goodput_per_s=_rate(goodput, wall_s))


def _wall_s(records: Sequence[StreamRecord]) -> float:
    if not records:
        return 0.0
    return max(record.ended_at for record in records) - min(record.started_at for record in records)


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0
