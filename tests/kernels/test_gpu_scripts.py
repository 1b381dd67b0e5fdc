"""The GPU benchmark scripts' code paths, run on the CPU with the tiny model for one tiny iteration.

No timing is asserted: these keep the scripts from rotting (every entry measured, no errors recorded, the
decode-only attention variant equal to `Talker.forward`, the hand-off's checks able to fail).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from loadtest.gpu import gpu_codec_slots, gpu_micro, gpu_table, ucx_kv_handoff
from loadtest.gpu.gpu_common import capture_graph, count_flops, count_launches
from loadtest.gpu.ucx_kv_blocks import HandoffSpec, HandoffSpecError, block_contents, block_ids, same_bits

TINY_SPEC = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_size": 4, "dtype": "float32",
             "pool_blocks": 12}


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_micro_benchmarks_measure_every_part_on_cpu(tmp_path):
    out = tmp_path / "micro.json"
    rc = gpu_micro.main([
        "--out", str(out), "--device", "cpu", "--preset", "tiny", "--dtype", "float32",
        "--batch-sizes", "2", "--codec-batch-sizes", "2", "--context", "9", "--warmup", "0", "--reps", "1",
        "--codec-warmup", "0", "--codec-reps", "1", "--chunk-frames", "1", "--full-frames", "2",
        "--copy-mib", "1", "--gemm-size", "16", "--commit", "test",
    ])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == []
    talker, predictor, codec = report["talker_step"][0], report["predictor_frame"][0], report["codec"][0]
    # The graph variant computes what Talker.forward computes (float32 on the CPU: same kernels).
    assert talker["variant_rel_error"] < 1e-5
    assert talker["bytes_read"] > talker["weight_bytes"] > 0 and talker["floor_ms"] > 0 and talker["flops"] > 0
    assert talker["forward"]["launches"]["aten_ops"] > 0 and talker["forward"]["launches"]["cuda_kernels"] is None
    assert "host syncs" in talker["forward"]["graph_error"]
    assert predictor["sampled"]["eager"]["median_ms"] > 0 and predictor["greedy"]["graph_error"]
    assert codec["stream_chunk"]["eager"]["per_frame_ms"] > 0 and codec["full"]["floor_per_frame_ms"] > 0
    assert report["codec_graph"][0]["graph_error"] == "CUDA graphs need a CUDA device"
    assert report["environment"]["commit"] == "test"
    lines = gpu_table.tables(report)
    assert any(line.startswith("| 2 |") for line in lines)


def test_launch_count_and_capture_report_off_cuda():
    x = torch.ones(4)
    counts = count_launches(lambda: (x * 2).sum(), torch.device("cpu"))
    assert counts["cuda_kernels"] is None and counts["aten_ops"] >= 2
    captured = capture_graph(lambda: x * 2, torch.device("cpu"))
    assert captured.replay is None and "CUDA" in captured.error


def test_flop_count_falls_back_to_the_estimate_when_the_counter_refuses():
    a = torch.ones(3, 4)
    assert count_flops(lambda: a @ a.T, estimate=1) == {"flops": 72, "flops_source": "torch.utils.flop_counter"}

    def refused() -> None:
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")

    fallback = count_flops(refused, estimate=99)
    assert fallback["flops"] == 99 and "incompatible" in fallback["flops_source"]


def test_handoff_blocks_are_scattered_distinct_and_checkable():
    spec = HandoffSpec(**TINY_SPEC, device="cpu")
    assert spec.blocks_for(9) == 3 and spec.block_bytes == 2 * 2 * 4 * 2 * 16 * 4
    sender, receiver = block_ids(spec, 9, seed=5, side="sender"), block_ids(spec, 9, seed=5, side="receiver")
    assert len(set(sender.tolist())) == 3 and sender.tolist() != receiver.tolist()
    data = block_contents(spec, 9, seed=5)
    assert same_bits(data, block_contents(spec, 9, seed=5))
    changed = data.clone()
    changed.view(-1)[17] += 1.0
    assert not same_bits(data, changed)
    assert not same_bits(data, block_contents(spec, 9, seed=6))


def test_handoff_spec_refuses_bad_settings():
    with pytest.raises(HandoffSpecError) as too_long:
        HandoffSpec(**TINY_SPEC, device="cpu").blocks_for(100)
    assert too_long.value.code == "prompt_too_long"
    with pytest.raises(HandoffSpecError) as bad_dtype:
        HandoffSpec(**{**TINY_SPEC, "dtype": "int8"}, device="cpu")
    assert bad_dtype.value.code == "invalid_dtype"
    with pytest.raises(HandoffSpecError) as bad_layers:
        HandoffSpec(**{**TINY_SPEC, "num_layers": 0}, device="cpu")
    assert bad_layers.value.code == "invalid_spec"


def test_ucx_handoff_between_two_processes_on_cpu(tmp_path):
    out = tmp_path / "ucx.json"
    rc = ucx_kv_handoff.main(["--out", str(out), "--device", "cpu", "--tokens", "9", "--warmup", "0",
                              "--reps", "2", "--spec", json.dumps(TINY_SPEC), "--logs", str(tmp_path / "logs"),
                              "--timeout", "60"])
    report = json.loads(out.read_text())
    assert rc == 0
    rows = report["runs"][0]["trials"]
    assert {row["mode"] for row in rows} == {"ping", "per_block", "staged"}
    assert all(row["all_equal"] and row["checked"] == 2 for row in rows if row["mode"] != "ping")


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


def test_commit_ab_refuses_a_budget_too_small_for_its_meshes(tmp_path):
    # A mesh cut short by its deadline gives no row, only spent device time: the script refuses up front.
    repo = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "BUDGET_S": "300", "WHEELS": "none", "OUT": str(tmp_path)}
    run = subprocess.run(["bash", "loadtest/gpu/commit_ab.sh", "no_tree_a", "no_tree_b", "2"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "leaves 75 s a run for 4 runs" in run.stdout
    assert list(tmp_path.iterdir()) == []  # no mesh was started
