"""The device-trace summary's arithmetic on two hand-made traces: busy time, overlap, gaps, kernels by time."""

from __future__ import annotations

import gzip
import json

from loadtest.gpu.device_trace_summary import summarize


def write_trace(path, base_ns, kernels):
    events = [{"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur} for name, ts, dur in kernels]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10_000})  # not device work
    with gzip.open(path, "wt") as handle:
        json.dump({"baseTimeNanoseconds": base_ns, "traceEvents": events}, handle)
    return path


def test_busy_overlap_and_gaps_are_measured_on_one_clock(tmp_path):
    # decode: 0-100, 150-200 us; vocoder (its base 50 us later): 60-110, 300-400 us on the shared clock.
    decode = write_trace(tmp_path / "decode-1.json.gz", 0, [("void gemm<float>(int)", 0, 100), ("norm", 150, 50)])
    vocoder = write_trace(tmp_path / "vocoder-2.json.gz", 50_000, [("conv", 10, 50), ("conv", 250, 100)])
    report = summarize([decode, vocoder], top=5)
    # The shared window: from the later first kernel (60) to the earlier last end (200).
    assert report["window_ms"] == 0.14
    decode_report = report["processes"]["decode-1"]
    assert abs(decode_report["busy_ms"] - 0.09) < 1e-9  # 60-100 and 150-200
    assert decode_report["top_kernels"][0] == {"kernel": "norm", "count": 1, "total_ms": 0.05}
    assert abs(report["card"]["two_at_once_ms"] - 0.04) < 1e-9  # 60-100: both ran
    assert abs(report["card"]["busy_fraction"] - (50 + 50) / 140) < 1e-9  # 60-110 and 150-200
    gaps = {gap["from_us"]: gap for gap in report["card"]["idle_gaps"]}
    assert gaps[20]["count"] == 1 and abs(gaps[20]["total_ms"] - 0.04) < 1e-9  # 110-150
