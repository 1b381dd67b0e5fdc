"""The step-loop micro-benchmark runs and writes its JSON report."""

from __future__ import annotations

import json

from loadtest.gpu.engine_step_bench import main
from services.engine import model_ops
from services.model.sampling import sample


def test_bench_writes_steps_per_second_and_the_time_split(tiny_checkpoint, tmp_path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--checkpoint", str(tiny_checkpoint), "--batch-sizes", "1", "3", "--steps", "3", "--warmup", "1",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["batch"] for row in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["steps_per_s"] > 0 and row["mean_rows_per_step"] > 0
        assert 0.0 < row["outside_forward_share"] < 1.0
        parts = row["talker_forward_ms"] + row["code_predictor_forward_ms"] + row["sampling_ms"] + row["other_ms"]
        assert abs(parts - row["step_ms"]) < 1e-6 * max(1.0, row["step_ms"])
    assert model_ops.sample is sample, "the benchmark's instrumentation is undone"
