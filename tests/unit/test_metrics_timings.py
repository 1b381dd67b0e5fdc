"""Wall-time summaries a replica keeps for STATS and /metrics (`services/metrics/timings.py`): nearest-rank percentiles
over the recent window, cumulative buckets whose bounds are inclusive as Prometheus' `le` is, and the histogram
families decode's and the vocoder's /metrics render from them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.metrics import names
from services.metrics.from_stats import decode_families, stats_registry, timings_families, vocoder_families
from services.metrics.timings import WINDOW, Timings


def test_an_empty_summary_has_no_percentiles_and_zero_buckets():
    snapshot = Timings().snapshot()
    assert snapshot["count"] == 0 and snapshot["sum_s"] == 0.0
    assert snapshot["p50_ms"] is None and snapshot["p95_ms"] is None and snapshot["max_ms"] is None
    assert all(count == 0 for _, count in snapshot["buckets"])


def test_percentiles_are_nearest_rank_and_buckets_cumulative_with_inclusive_bounds():
    timings = Timings(bounds=(0.01, 0.1))
    for milliseconds in (5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560):
        timings.observe(milliseconds / 1000)
    snapshot = timings.snapshot()
    assert snapshot["count"] == 10 and abs(snapshot["sum_s"] - 5.115) < 1e-9
    assert snapshot["p50_ms"] == 80.0  # the 5th of 10
    assert snapshot["p95_ms"] == 2560.0  # the 10th: ceil(0.95 * 10)
    assert snapshot["max_ms"] == 2560.0
    assert snapshot["buckets"] == [[0.01, 2], [0.1, 5], ["+Inf", 10]]  # 10 ms counts in le=0.01


def test_percentiles_follow_the_recent_window_while_the_totals_keep_everything():
    timings = Timings()
    for _ in range(WINDOW):
        timings.observe(2.0)  # a slow start ...
    for _ in range(WINDOW):
        timings.observe(0.02)  # ... then a window of fast ones
    snapshot = timings.snapshot()
    assert snapshot["p95_ms"] == 20.0 and snapshot["max_ms"] == 20.0
    assert snapshot["count"] == 2 * WINDOW and snapshot["buckets"][-1] == ["+Inf", 2 * WINDOW]


def _decode_stats(parts: dict) -> dict:
    """The decode STATS fields `decode_families` reads, with the given voice prompt timings."""
    counters = ("requests_finished", "requests_stood_down", "preemptions", "requests_migrated", "kv_blocks_in_use",
                "kv_blocks_total", "waiting_sequences", "active_requests", "steps", "frames", "step_errors",
                "graph_capture_failures")
    return dict.fromkeys(counters, 0) | {"failures_by_code": {}, "voice_prompt_seconds": parts}


def test_decode_metrics_render_each_timed_part_as_a_histogram():
    read, compute = Timings(), Timings()
    read.observe(0.004)
    for seconds in (0.03, 0.2, 7.0):
        compute.observe(seconds)
    stats = _decode_stats({"audio_read": read.snapshot(), "compute": compute.snapshot()})
    text = generate_latest(stats_registry(lambda: stats, decode_families)).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == names.VOICE_PROMPT)
    samples = {(s.name, s.labels["part"], s.labels.get("le")): s.value for s in family.samples}
    assert samples[(names.VOICE_PROMPT + "_bucket", "compute", "0.05")] == 1
    assert samples[(names.VOICE_PROMPT + "_bucket", "compute", "5.0")] == 2
    assert samples[(names.VOICE_PROMPT + "_bucket", "compute", "+Inf")] == 3
    assert samples[(names.VOICE_PROMPT + "_count", "compute", None)] == 3
    assert abs(samples[(names.VOICE_PROMPT + "_sum", "compute", None)] - 7.23) < 1e-9
    assert samples[(names.VOICE_PROMPT + "_count", "audio_read", None)] == 1


def test_vocoder_metrics_render_the_codec_timings():
    call = Timings()
    call.observe(0.015)
    stats = {"terminals_by_code": {}, "active_streams": 0, "partitions": [], "audio_chunks": 0, "codec_calls": 1,
             "redecodes": 0, "decode_owners_lost": 0, "codec_capture_failures": 0,
             "codec_seconds": {"call": call.snapshot(), "chunk": Timings().snapshot()}}
    text = generate_latest(stats_registry(lambda: stats, vocoder_families)).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == names.CODEC)
    counts = {s.labels["part"]: s.value for s in family.samples if s.name == names.CODEC + "_count"}
    assert counts == {"call": 1, "chunk": 0}


def test_a_replica_that_clones_no_voice_renders_no_histogram():
    assert timings_families(names.VOICE_PROMPT, "doc", {}) == []
    text = generate_latest(stats_registry(lambda: _decode_stats({}), decode_families)).decode()
    assert names.VOICE_PROMPT not in text
