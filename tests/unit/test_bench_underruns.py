"""The public method's per-request figures (TTFB, first playable and audible sample, the audible-clock player's
underrun events and stall beside the 10 ms rule) and their level sums, on scripted streams."""

from __future__ import annotations

import pytest

from loadtest.bench.audible import AudibleSample
from loadtest.bench.metrics import (
    ChunkArrival,
    Slo,
    StreamError,
    StreamRecord,
    arrivals_from,
    request_metrics,
    summarize_level,
)
from messages.audio_format import SAMPLE_RATE

MS = SAMPLE_RATE // 1000  # samples in a millisecond


def record(chunks: list[tuple[float, int]], *, audible: tuple[float, int] | None, first_byte: float | None = None,
           error: StreamError | None = None, index: int = 0) -> StreamRecord:
    """A stream from 0.0: chunks of (arrival, milliseconds of audio); `audible`: (arrival, sample index)."""
    arrivals = tuple(ChunkArrival(at=at, num_samples=ms * MS) for at, ms in chunks)
    return StreamRecord(index=index, prompt_id="p", started_at=0.0, sent_at=0.0,
                        ended_at=max((at for at, _ in chunks), default=0.0) + 0.001, chunks=arrivals,
                        sample_rate=SAMPLE_RATE, error=error,
                        first_byte_at=first_byte if first_byte is not None else (chunks[0][0] if chunks else None),
                        first_audible=None if audible is None else AudibleSample(*audible))


def test_arrivals_from_counts_only_the_audible_part_of_its_chunk():
    chunks = [ChunkArrival(1.0, 100), ChunkArrival(2.0, 0), ChunkArrival(3.0, 100), ChunkArrival(4.0, 50)]
    assert arrivals_from(chunks, 0, 100) == [(1.0, 1.0), (3.0, 1.0), (4.0, 0.5)]
    assert arrivals_from(chunks, 150, 100) == [(3.0, 0.5), (4.0, 0.5)]
    assert arrivals_from(chunks, 100, 100) == [(3.0, 1.0), (4.0, 0.5)]


def test_the_audible_clock_starts_at_the_first_audible_sample_and_counts_every_empty_buffer():
    # 100 ms of quiet lead-in at 0.10, then audio audible from its 100th ms: the public player starts at 0.30 with
    # the 100 ms of the second chunk; the third chunk comes at 0.402 (2 ms late: an event, not a gap), the fourth
    # 20 ms after the buffer ran dry at 0.452 (an event and a gap).
    metrics = request_metrics(record([(0.10, 100), (0.30, 100), (0.402, 50), (0.472, 50)],
                                     audible=(0.30, 100 * MS), first_byte=0.09))
    assert metrics.ttfb_s == pytest.approx(0.09)
    assert metrics.first_playable_s == metrics.first_packet_s == pytest.approx(0.10)
    assert metrics.first_audible_s == pytest.approx(0.30)
    player = metrics.audible_player
    assert player.underruns_s == pytest.approx((0.002, 0.020))
    assert player.num_underruns == 2 and player.total_underrun_s == pytest.approx(0.022)
    assert player.num_gaps == 1  # the 10 ms rule, beside
    # the first-chunk player of the existing figures waits for the second chunk too
    assert metrics.player.underruns_s[0] == pytest.approx(0.10)


def test_a_buffer_that_only_just_keeps_up_has_no_underrun():
    metrics = request_metrics(record([(0.10, 100), (0.20, 100), (0.25, 100)], audible=(0.10, 0)))
    assert metrics.audible_player.num_underruns == 0 and metrics.audible_player.total_underrun_s == 0.0


def test_level_sums_underruns_stall_inaudible_and_overload_refusals():
    records = [
        record([(0.10, 100), (0.30, 100)], audible=(0.10, 0), index=0),  # one 100 ms stall
        record([(0.05, 100), (0.10, 100)], audible=(0.05, 0), index=1),  # smooth
        record([(0.05, 100)], audible=None, index=2),  # completed, never audible
        record([], audible=None, error=StreamError("too_many_requests", "busy", http_status=429), index=3),
        record([], audible=None, error=StreamError("queue_full", "full"), index=4),  # the same refusal on a socket
        record([(0.05, 100)], audible=(0.05, 0), error=StreamError("connection_closed", "cut"), index=5),
    ]
    summary = summarize_level(records, Slo())
    assert (summary.num_completed, summary.num_failed) == (3, 3)
    assert summary.num_inaudible == 1
    assert (summary.num_underrun_events, summary.num_streams_with_underruns) == (1, 1)
    assert summary.total_stall_s == pytest.approx(0.10) and summary.num_audible_gaps == 1
    assert summary.num_overloaded == 2
    assert summary.first_audible_s.count == 2 and summary.first_audible_s.median == pytest.approx(0.075)
    assert summary.ttfb_s.count == 3 and summary.first_playable_s.count == 3
    assert {"ttfb_s", "first_audible_s", "num_underrun_events", "total_stall_s"} <= set(summary.to_dict())
