"""The codec slots benchmark's code paths, run on the CPU with the tiny codec for one tiny iteration (no timing is
asserted: this keeps the script from rotting, and its equality check able to pass)."""

from __future__ import annotations

import json

import pytest
import torch

from loadtest.gpu import gpu_codec_slots


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_codec_slots_benchmark_runs_and_checks_on_cpu(tmp_path):
    out = tmp_path / "slots.json"
    rc = gpu_codec_slots.main(["--out", str(out), "--device", "cpu", "--tiny", "--batch-sizes", "1", "3",
                               "--chunk-frames", "2", "--max-rows", "4", "--warmup", "0", "--reps", "1",
                               "--commit", "test"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == []
    assert [(row["streams"], row["chunk_frames"]) for row in report["results"]] == [(1, 2), (3, 2)]
    for row in report["results"]:
        assert row["old_eager"]["audio_s_per_s"] > 0 and row["slots_eager"]["median_ms"] > 0
        assert "slots_graphed" not in row and row["check"]["slots_eager"]["equal"]
    assert report["warm_up"] == {"graphs": 0, "reason": "CUDA graphs need a CUDA device"}
    lines = gpu_codec_slots.table(report)
    assert lines[2].startswith("| 1 | 2 |") and lines[3].endswith("| True |")
