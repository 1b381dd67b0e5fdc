"""`loadtest/gpu/gpu_decode_path.py` on the CPU with the tiny model: every entry measured, every check passing.

No timing is asserted: this keeps the script the lead runs on the GPU from rotting, and runs its checks
(decode kernel vs reference in float32, whole steps fast and padded vs reference) on the CPU.
"""

from __future__ import annotations

import json

from loadtest.gpu import gpu_decode_path


def test_decode_path_script_runs_on_cpu(tmp_path):
    out = tmp_path / "decode_path.json"
    rc = gpu_decode_path.main(["--out", str(out), "--device", "cpu", "--tiny", "--batch-sizes", "1", "3",
                               "--context", "9", "--warmup", "0", "--reps", "1", "--copy-mib", "1",
                               "--commit", "test"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == [] and report["verdict"] == {"checks_pass": True, "sync_free": True}
    assert [row["batch"] for row in report["decode_step"]] == [1, 3]
    row = report["decode_step"][1]
    assert row["kernel_check_float32"]["equal"] and row["kernel_check_float32"]["max_abs_diff"] <= 1e-5
    assert max(row["step_rel_error"].values()) <= 1e-5
    # 3 rows pad to the 4-row bucket; 10 tokens in blocks of 16 need one column.
    assert row["graph_bucket"] == {"tokens": 4} and row["graph_mode"] == "padded eager (no CUDA)"
    for variant in ("reference", "fast", "graph"):
        assert row[variant]["eager"]["median_ms"] > 0 and row[variant]["launches"]["aten_ops"] > 0
    assert report["environment"]["commit"] == "test" and report["dtype"] == "float32"
    lines = gpu_decode_path.table(report["decode_step"])
    assert lines[-1].startswith("| 3 |") and "n/a / n/a" in lines[-1]
