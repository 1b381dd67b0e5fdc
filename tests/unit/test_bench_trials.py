"""Trials combined: the median of the trials with min and max, figure by figure, gates and max sustained rps."""

from __future__ import annotations

import statistics

import pytest

from loadtest.bench.report import headline_rows
from loadtest.bench.trials import combine_gates, combine_leaves, combine_max_sustained, combine_trials


def test_combine_leaves_takes_each_figure_across_trials():
    items = [{"a": 1.0, "s": {"p95": 0.3, "p99": None}, "errors": {"x": 2}},
             {"a": 5.0, "s": {"p95": 0.1, "p99": None}, "errors": {}},
             {"a": 3.0, "s": {"p95": 0.2, "p99": None}, "errors": {"y": 1}}]
    median = combine_leaves(items, statistics.median)
    assert median == {"a": 3.0, "s": {"p95": 0.2, "p99": None}, "errors": {"x": 0, "y": 0}}
    assert combine_leaves(items, min)["s"]["p95"] == 0.1 and combine_leaves(items, max)["errors"] == {"x": 2, "y": 1}


def test_a_gate_passes_only_when_every_trial_passed():
    gates = [{"passed": True, "reasons": []}, {"passed": False, "reasons": ["underrun"]}]
    assert combine_gates(gates) == {"passed": False, "reasons": ["underrun"], "passed_trials": 1, "num_trials": 2}


def test_max_sustained_rps_is_the_median_with_min_max_and_a_failed_trial_counts_as_zero():
    values = [{"rps": 4.0, "first_audible_s": {"p50": 0.02, "p95": 0.04, "p99": 0.05}, "ttfb_s": None},
              {"rps": None, "first_audible_s": None, "ttfb_s": None},
              {"rps": 8.0, "first_audible_s": {"p50": 0.03, "p95": 0.06, "p99": 0.07}, "ttfb_s": None}]
    combined = combine_max_sustained(values)
    assert (combined["rps"], combined["min"], combined["max"]) == (4.0, 0.0, 8.0)
    assert combined["per_trial"] == [4.0, None, 8.0]
    assert combined["first_audible_s"] == pytest.approx({"p50": 0.025, "p95": 0.05, "p99": 0.06})
    assert combine_max_sustained([values[1]])["rps"] is None


def _level(rate: float, p95: float, passed: bool, trial_tag: str) -> dict:
    stats = {"count": 1, "mean": p95, "median": p95, "p90": p95, "p95": p95, "p99": p95, "min": p95, "max": p95}
    summary = {"num_requests": 1, "num_completed": 1, "requests_per_s": rate, "audio_s_per_s": 1.0,
               "first_packet_s": stats, "first_audible_s": stats, "ttfb_s": stats, "continuous_share": 1.0,
               "goodput_per_s": rate, "num_underrun_events": 0 if passed else 3, "total_stall_s": 0.0,
               "num_audible_gaps": 0, "errors": {}}
    return {"level": {"mode": "open", "load": rate}, "summary": summary, "sustained": passed,
            "gate": {"passed": passed, "reasons": [] if passed else ["underrun"]},
            "requests": [{"index": 0, "tag": trial_tag}]}


def _document(seed: int, levels: list[dict], rps: float | None) -> dict:
    target = {"label": "mesh", "url": f"http://127.0.0.1:{9000 + seed}/v1/audio/speech", "transport": "http",
              "warmup": {"num_requests": 1}, "labels": {"transport": "http", "length_mode": "realistic",
                                                         "audible_threshold": "-50 dBFS", "audible_note": "n"},
              "max_sustained_rate": rps, "levels": levels,
              "max_sustained_rps": {"rps": rps, "first_audible_s": None, "ttfb_s": None}}
    return {"schema": "voxmesh.bench/1", "meta": {"date": "d"}, "length_mode": "realistic", "length": "l",
            "config": {"arrival_seed": seed, "p95_first_packet_bound_s": 0.5}, "public_method": {},
            "targets": [target], "comparison": None, "sweep": {"stopped_at_rps": None}}


def test_trials_combine_levels_run_by_some_trials_only():
    documents = [_document(0, [_level(1.0, 0.02, True, "a"), _level(2.0, 0.03, True, "a")], 2.0),
                 _document(1, [_level(1.0, 0.04, True, "b"), _level(2.0, 0.05, False, "b")], 1.0),
                 _document(2, [_level(1.0, 0.03, False, "c")], None)]  # its sweep stopped at the first rate
    combined = combine_trials(documents, fresh_mesh=True)
    assert combined["trials"]["count"] == 3 and combined["trials"]["arrival_seeds"] == [0, 1, 2]
    assert combined["trials"]["fresh_mesh"] is True
    target = combined["targets"][0]
    first, second = target["levels"]
    assert (first["num_trials"], second["num_trials"], second["trials"]) == (3, 2, [0, 1])
    assert first["summary"]["first_audible_s"]["p95"] == pytest.approx(0.03)
    assert (first["summary_min"]["first_audible_s"]["p95"], first["summary_max"]["first_audible_s"]["p95"]) == \
        pytest.approx((0.02, 0.04))
    assert first["gate"]["passed"] is False and first["gate"]["passed_trials"] == 2
    assert [request["trial"] for request in first["requests"]] == [0, 1, 2]
    assert target["max_sustained_rps"]["rps"] == 1.0 and target["max_sustained_rps"]["max"] == 2.0
    assert len(target["url"]) == 3, "each trial's fresh mesh has its own URL"
    assert [trial["targets"][0]["max_sustained_rps"]["rps"] for trial in combined["trials"]["per_trial"]] == \
        [2.0, 1.0, None]
    rows = "\n".join(headline_rows({**combined, "config": documents[0]["config"]}))
    assert "max sustained rps: 1" in rows and "FAIL underrun" in rows
