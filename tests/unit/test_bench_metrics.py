"""The bench's metric definitions against scripted streams whose stalls and first packets are known."""

from __future__ import annotations

import pytest

from loadtest.bench.metrics import (
    ChunkArrival,
    Slo,
    SloError,
    StreamError,
    StreamRecord,
    request_metrics,
    simulate_player,
    summarize,
    summarize_level,
)
from messages.audio_format import SAMPLE_RATE



def scripted(chunks: list[tuple[float, float]], *, start: float = 100.0, end: float | None = None,
             error: StreamError | None = None, index: int = 0) -> StreamRecord:
    """A record whose chunks arrive at `start + offset` carrying `seconds` of audio each."""
    arrivals = tuple(ChunkArrival(at=start + offset, num_samples=round(seconds * SAMPLE_RATE))
                     for offset, seconds in chunks)
    last = max((offset for offset, _ in chunks), default=0.0)
    return StreamRecord(index=index, prompt_id=f"p{index}", started_at=start, sent_at=start,
                        ended_at=start + (last if end is None else end), chunks=arrivals, sample_rate=SAMPLE_RATE,
                        error=error)


def test_stalls_first_packet_and_latency_are_the_scripted_ones():
    # Player starts at 0.30 with 0.16 s; the 0.40 chunk is early (runs dry at 1.10); the 1.25 chunk waits 0.15 s
    # (a gap, dry at 1.89); the 1.895 chunk waits 5 ms (an underrun, not a gap).
    record = scripted([(0.30, 0.16), (0.40, 0.64), (1.25, 0.64), (1.895, 0.64)], end=2.6)
    metrics = request_metrics(record)
    assert metrics.ok and metrics.error_code is None
    assert metrics.first_packet_s == pytest.approx(0.30)
    assert metrics.latency_s == pytest.approx(2.6)
    assert metrics.audio_s == pytest.approx(2.08)
    assert metrics.rtf == pytest.approx(2.6 / 2.08)
    assert metrics.chunk_intervals_s == pytest.approx((0.10, 0.85, 0.645))
    assert metrics.player.underruns_s == pytest.approx((0.15, 0.005))
    assert metrics.player.max_underrun_s == pytest.approx(0.15)
    assert metrics.player.total_underrun_s == pytest.approx(0.155)
    assert metrics.player.num_gaps == 1
    assert not metrics.is_continuous


def test_empty_chunks_do_not_count_as_the_first_packet_or_as_intervals():
    metrics = request_metrics(scripted([(0.05, 0.0), (0.20, 0.16), (0.21, 0.0), (0.30, 0.64)], end=1.0))
    assert metrics.first_packet_s == pytest.approx(0.20)
    assert metrics.num_chunks == 2
    assert metrics.chunk_intervals_s == pytest.approx((0.10,))
    assert metrics.player.underruns_s == ()
    assert metrics.is_continuous


def test_a_gap_is_an_underrun_longer_than_ten_milliseconds():
    # Each chunk plays 0.08 s; the next arrives 10 ms / 11 ms / 0 ms after the buffer ran dry.
    exactly_ten = simulate_player([(1.0, 0.08), (1.09, 0.08)])
    eleven = simulate_player([(1.0, 0.08), (1.091, 0.08)])
    on_time = simulate_player([(1.0, 0.08), (1.08, 0.08), (1.16, 0.08)])
    assert exactly_ten.underruns_s == pytest.approx((0.010,)) and exactly_ten.num_gaps == 0
    assert exactly_ten.is_continuous
    assert eleven.max_underrun_s == pytest.approx(0.011) and eleven.num_gaps == 1
    assert on_time.underruns_s == () and on_time.max_underrun_s == 0.0 and on_time.is_continuous


def test_playback_resumes_at_the_late_chunk_so_later_stalls_are_measured_from_there():
    # Dry at 1.1; chunk at 1.3 (wait 0.2), plays to 1.4; chunk at 1.45 (wait 0.05), plays to 1.55; chunk at 1.5
    # arrives while playing (no wait).
    player = simulate_player([(1.0, 0.1), (1.3, 0.1), (1.45, 0.1), (1.5, 0.1)])
    assert player.underruns_s == pytest.approx((0.2, 0.05))
    assert player.num_gaps == 2


def test_a_failed_request_keeps_its_audio_but_is_not_completed_nor_continuous():
    error = StreamError(code="capacity", message="preempted", stage="decode")
    metrics = request_metrics(scripted([(0.2, 0.16)], end=0.5, error=error))
    assert not metrics.ok and metrics.error_code == "capacity"
    assert metrics.audio_s == pytest.approx(0.16) and metrics.first_packet_s == pytest.approx(0.2)
    assert not metrics.is_continuous


def test_a_request_without_audio_has_no_first_packet_nor_rtf():
    metrics = request_metrics(scripted([], end=0.3, error=StreamError(code="queue_full", message="full")))
    assert metrics.first_packet_s is None and metrics.rtf is None and metrics.audio_s == 0.0
    assert metrics.latency_s == pytest.approx(0.3)


def test_summary_percentiles_interpolate_between_ranks():
    summary = summarize([0.4, 0.1, 0.3, 0.2])
    assert summary.count == 4
    assert summary.mean == pytest.approx(0.25) and summary.median == pytest.approx(0.25)
    assert summary.p90 == pytest.approx(0.37) and summary.p95 == pytest.approx(0.385)
    assert summary.p99 == pytest.approx(0.397)
    assert (summary.min, summary.max) == (0.1, 0.4)
    assert summarize([]).p95 is None


def level_records() -> list[StreamRecord]:
    """Four requests over 2 s: two on time, one with a 0.15 s gap, one failed."""
    return [
        scripted([(0.1, 0.16), (0.2, 0.64)], start=10.0, end=0.9, index=0),
        scripted([(0.3, 0.16), (0.4, 0.64)], start=10.5, end=1.0, index=1),
        scripted([(0.2, 0.16), (0.51, 0.64)], start=11.0, end=1.0, index=2),  # dry at 0.36: waits 0.15
        scripted([], start=11.5, end=0.1, error=StreamError(code="queue_full", message="full"), index=3),
    ]


def test_level_summary_counts_rates_continuity_and_goodput():
    level = summarize_level(level_records(), Slo(), num_not_sent=1)
    assert (level.num_requests, level.num_completed, level.num_failed, level.num_not_sent) == (5, 3, 1, 1)
    assert level.errors == {"queue_full": 1}
    assert level.wall_s == pytest.approx(2.0)  # 10.0 .. 12.0
    assert level.requests_per_s == pytest.approx(1.5)
    assert level.audio_s == pytest.approx(3 * 0.80)
    assert level.audio_s_per_s == pytest.approx(1.2)
    assert level.first_packet_s.median == pytest.approx(0.2)
    assert level.first_packet_s.max == pytest.approx(0.3)
    assert level.latency_s.mean == pytest.approx((0.9 + 1.0 + 1.0) / 3)
    assert level.max_underrun_s.max == pytest.approx(0.15)
    assert level.num_gaps == 1
    assert level.continuous_share == pytest.approx(2 / 3)
    assert level.goodput_count == 2 and level.goodput_share == pytest.approx(2 / 5)
    assert level.goodput_per_s == pytest.approx(1.0)


def test_goodput_follows_a_stated_slo():
    tight = summarize_level(level_records(), Slo(first_packet_s=0.25))
    lenient = summarize_level(level_records(), Slo(first_packet_s=0.25, require_continuous=False))
    assert tight.goodput_count == 1  # request 1 is late, request 2 has a gap
    assert lenient.goodput_count == 2  # request 2's gap no longer matters


def test_level_summary_serializes_every_field():
    document = summarize_level(level_records(), Slo()).to_dict()
    assert document["first_packet_s"]["p95"] == pytest.approx(0.29)
    assert {"requests_per_s", "audio_s_per_s", "continuous_share", "goodput_per_s", "errors"} <= set(document)


def test_an_impossible_slo_is_refused():
    with pytest.raises(SloError, match="positive"):
        Slo(first_packet_s=0.0)
