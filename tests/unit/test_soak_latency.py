"""The soak's latency verdict (loadtest/soak/latency_flatness.py) on request rows made up for the purpose, and the
bench's `started_s`, which places each request in its level."""

from __future__ import annotations

import pytest

from loadtest.bench.loadgen import LevelResult, Target
from loadtest.bench.metrics import ChunkArrival, Slo, StreamRecord, summarize_level
from loadtest.bench.stages import STAGES
from loadtest.bench.workload import Level
from loadtest.soak.latency_flatness import (
    NO_STAGES,
    P95_RATIO,
    P95_SLACK_S,
    latency_verdict,
    markdown_lines,
    window_rows,
)

STAGE_S = {"connect": 0.001, "submit": 0.002, "queue": 0.003, "first_frame": 0.030, "first_audio": 0.010,
           "delivery": 0.001}


def row(started_s: float, first_audible_s: float | None, *, first_packet_s: float = 0.04,
        stages: dict | None = None) -> dict:
    return {"started_s": started_s, "first_audible_s": first_audible_s, "first_packet_s": first_packet_s,
            "first_packet_stages": stages, "ok": True}


def level_rows(first_audio_of, *, stages_of=None, seconds: int = 600, per_second: int = 2) -> list[dict]:
    """`per_second` requests each second of a `seconds` level; `first_audio_of(t)` their first audio."""
    times = [second + k / per_second for second in range(seconds) for k in range(per_second)]
    return [row(t, first_audio_of(t), stages=None if stages_of is None else stages_of(t)) for t in times]


def by_figure(verdict: dict) -> dict[str, dict]:
    return {row["figure"]: row for row in verdict["rows"]}


def test_windows_take_the_first_and_last_minutes_of_the_level():
    rows = [row(t, 0.05) for t in (0.0, 59.9, 60.0, 300.0, 539.9, 540.0, 599.5)] + [{"started_s": None}]
    first, last = window_rows(rows, duration_s=600.0, window_s=60.0)
    assert [r["started_s"] for r in first] == [0.0, 59.9] and [r["started_s"] for r in last] == [540.0, 599.5]


def test_steady_latencies_with_stages_are_flat():
    verdict = latency_verdict(level_rows(lambda t: 0.045 + 0.01 * ((t * 7) % 1), stages_of=lambda t: STAGE_S),
                              600.0, 60.0)
    assert verdict["flat"] and verdict["has_stages"] and verdict["notes"] == []
    figures = by_figure(verdict)
    assert list(figures) == ["first_audible_s", *STAGES]
    audio = figures["first_audible_s"]
    assert audio["first"]["count"] == audio["last"]["count"] == 120
    assert audio["p95_bound_s"] == pytest.approx(audio["first"]["p95_s"] * P95_RATIO + P95_SLACK_S)
    assert figures["first_frame"]["last"]["p50_s"] == pytest.approx(0.030)


def test_first_audio_drifting_past_the_bound_is_not_flat():
    # 50 ms at the start, 50 ms + 4 ms a minute: 86 ms in the last minute, past 50 x 1.25 + 5 = 67.5 ms
    verdict = latency_verdict(level_rows(lambda t: 0.050 + 0.004 * t / 60), 600.0, 60.0)
    assert not verdict["flat"] and not by_figure(verdict)["first_audible_s"]["flat"]
    # a smaller drift (10 ms over the level) stays within it
    assert latency_verdict(level_rows(lambda t: 0.050 + 0.010 * t / 600), 600.0, 60.0)["flat"]


def test_one_stage_growing_is_not_flat_though_first_audio_hides_it():
    def stages_of(t: float) -> dict:
        return STAGE_S | {"queue": 0.003 + 0.020 * t / 600}  # the queue grows by 20 ms over the level

    verdict = latency_verdict(level_rows(lambda t: 0.2, stages_of=stages_of), 600.0, 60.0)
    figures = by_figure(verdict)
    assert figures["first_audible_s"]["flat"] and not figures["queue"]["flat"] and not verdict["flat"]
    assert all(figures[stage]["flat"] for stage in STAGES if stage != "queue")


def test_without_stage_data_first_audio_is_judged_alone_and_falls_back_to_the_first_packet():
    rows = level_rows(lambda t: None)  # no audible sample measured: first packet it is
    verdict = latency_verdict(rows, 600.0, 60.0)
    assert verdict["first_audio"] == "first_packet_s" and not verdict["has_stages"]
    assert [r["figure"] for r in verdict["rows"]] == ["first_packet_s"] and verdict["flat"]
    assert verdict["notes"] == [NO_STAGES]
    lines = markdown_lines(verdict)
    assert any(NO_STAGES in line for line in lines)
    assert "| first_packet_s | 120, 40.0 ms / 40.0 ms | 120, 40.0 ms / 40.0 ms | 55.0 ms | yes |" in lines


def test_an_empty_window_is_not_flat():
    rows = [r for r in level_rows(lambda t: 0.05) if r["started_s"] < 500]  # the load stopped early
    verdict = latency_verdict(rows, 600.0, 60.0)
    assert by_figure(verdict)["first_audible_s"]["flat"] is None and not verdict["flat"]
    assert "| first_audible_s | 120, 50.0 ms / 50.0 ms | 0, - / - | 67.5 ms | - |" in markdown_lines(verdict)


def test_each_request_row_says_when_it_started_in_its_level():
    def record(index: int, started_at: float) -> StreamRecord:
        return StreamRecord(index=index, prompt_id=f"p{index}", started_at=started_at, sent_at=started_at + 0.001,
                            ended_at=started_at + 1.0, chunks=(ChunkArrival(started_at + 0.05, 2400),),
                            sample_rate=24000, request_id=f"req_{index}")

    records = [record(0, 1000.25), record(1, 1000.5), record(2, 1030.25)]
    result = LevelResult(Target("mesh", "ws://127.0.0.1:1/v1/audio/speech/stream"), Level("open", 1.0, 3),
                         summarize_level(records, Slo()), records)
    rows = result.requests_to_dicts()
    assert [r["started_s"] for r in rows] == pytest.approx([0.0, 0.25, 30.0])
    assert rows[0]["first_packet_s"] == pytest.approx(0.05) and rows[0]["request_id"] == "req_0"


def test_windows_longer_than_half_the_level_are_shortened_so_they_do_not_overlap():
    verdict = latency_verdict(level_rows(lambda t: 0.050 + 0.004 * t, seconds=20), 20.0, 60.0)
    assert verdict["window_s"] == 10.0 and verdict["last_window_s"] == [10.0, 20.0]
    assert [row["first"]["count"] for row in verdict["rows"]] == [20] and "half the level" in verdict["notes"][-1]
    assert not verdict["flat"], "50-90 ms against 90-130 ms: the shortened windows still see the drift"
