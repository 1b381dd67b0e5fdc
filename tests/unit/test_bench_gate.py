"""The public method's hard gate per level, the sweep's stopping rule, the rate ladder and `max sustained rps`."""

from __future__ import annotations

import pytest

from loadtest.bench.audible import AudibleSample
from loadtest.bench.gate import Gate, SweepStop, rate_ladder, sustained_index
from loadtest.bench.loadgen import LevelResult, Target
from loadtest.bench.metrics import ChunkArrival, Slo, SloError, StreamError, StreamRecord, summarize_level
from loadtest.bench.report import max_sustained_rps, target_section
from loadtest.bench.workload import Level, LoadError
from messages.audio_format import SAMPLE_RATE


def stream(index: int, *, audible_after: float = 0.02, stall: float = 0.0, audible: bool = True,
           error: StreamError | None = None) -> StreamRecord:
    """Two 100 ms chunks; the second `stall` s after the first one's audio ran out."""
    chunks = (ChunkArrival(audible_after, SAMPLE_RATE // 10), ChunkArrival(audible_after + 0.1 + stall,
                                                                          SAMPLE_RATE // 10))
    return StreamRecord(index=index, prompt_id="p", started_at=0.0, sent_at=0.0, ended_at=1.0, chunks=chunks,
                        sample_rate=SAMPLE_RATE, error=error, first_byte_at=audible_after,
                        first_audible=AudibleSample(audible_after, 0) if audible else None)


def verdict(records, gate=Gate(), not_sent=0):
    return gate.verdict(summarize_level(records, Slo(), num_not_sent=not_sent))


def test_a_clean_level_passes():
    assert verdict([stream(0), stream(1)]).passed


@pytest.mark.parametrize(("records", "not_sent", "reasons"), [
    ([stream(0), stream(1, stall=0.001)], 0, ("underrun",)),  # 1 ms: under the 10 ms rule, still an underrun
    ([stream(0), stream(1, audible=False)], 0, ("inaudible",)),
    ([stream(0)], 1, ("incomplete",)),
    ([stream(0), stream(1, error=StreamError("model_error", "boom"))], 0, ("incomplete", "error")),
    ([stream(0), stream(1, error=StreamError("too_many_requests", "busy", http_status=429))], 0,
     ("incomplete", "error", "http_429")),
    ([], 0, ("incomplete",)),
])
def test_each_failed_condition_fails_the_gate_and_is_named(records, not_sent, reasons):
    result = verdict(records, not_sent=not_sent)
    assert not result.passed and result.reasons == reasons


def test_the_optional_p95_bound_is_on_the_first_audible_sample():
    records = [stream(index, audible_after=0.01 * (index + 1)) for index in range(10)]  # 10..100 ms
    assert verdict(records, Gate(p95_first_audible_bound_s=0.1)).passed
    assert verdict(records, Gate(p95_first_audible_bound_s=0.05)).reasons == ("p95_over_bound",)
    with pytest.raises(SloError):
        Gate(p95_first_audible_bound_s=0.0)


def test_sustained_is_the_last_pass_before_the_first_failure():
    assert sustained_index([True, True, False, True]) == 1  # a lucky pass above a failure never counts
    assert sustained_index([True, True]) == 1
    assert sustained_index([False, True]) is None
    assert sustained_index([]) is None


def test_the_sweep_stops_at_the_first_failing_rate():
    stop = SweepStop()
    good, bad = verdict([stream(0)]), verdict([stream(0, stall=0.5)])
    for rate, result in ((1.0, good), (2.0, good)):
        assert stop.should_run()
        stop.record(rate, result)
    stop.record(4.0, bad)
    assert not stop.should_run() and stop.stopped_at == 4.0
    stop.record(8.0, bad)
    assert stop.stopped_at == 4.0


def test_rate_ladder_is_geometric_and_bounded():
    assert rate_ladder(1.0, 8.0, 2.0) == [1.0, 2.0, 4.0, 8.0]
    assert rate_ladder(2.0, 10.0, 1.5) == [2.0, 3.0, 4.5, 6.75]
    for bad in ((0.0, 4.0, 2.0), (4.0, 2.0, 2.0), (1.0, 4.0, 1.0)):
        with pytest.raises(LoadError):
            rate_ladder(*bad)


def level_result(rate: float, records) -> LevelResult:
    return LevelResult(Target("mesh", "http://x", "http"), Level("open", rate, len(records)),
                       summarize_level(records, Slo()), list(records))


def test_max_sustained_rps_reports_its_levels_audible_percentiles_and_the_section_labels_it():
    results = [level_result(4.0, [stream(0, stall=0.3)]),  # given out of order: read in ascending rate
               level_result(1.0, [stream(0, audible_after=0.03), stream(1, audible_after=0.05)]),
               level_result(2.0, [stream(0, audible_after=0.04)])]
    best = max_sustained_rps(results, Gate())
    assert best["rps"] == 2.0
    assert best["first_audible_s"] == pytest.approx({"p50": 0.04, "p95": 0.04, "p99": 0.04})
    section = target_section(results[0].target, results, 0.5, {}, gate=Gate(), length_mode="realistic")
    assert [level["gate"]["passed"] for level in section["levels"]] == [False, True, True]
    assert section["labels"]["transport"] == "http" and section["labels"]["length_mode"] == "realistic"
    labels = section["labels"]
    assert "-50 dBFS" in labels["audible_threshold"] and "random weights" in labels["audible_note"]
    assert max_sustained_rps(results[:1], Gate())["rps"] is None
