"""The GPU benchmark scripts' code paths, run on the CPU with the tiny model for one tiny iteration.

No timing is asserted: these keep the scripts from rotting (every entry measured, no errors recorded, the
decode-only attention variant equal to `Talker.forward`, the hand-off's checks able to fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loadtest.gpu import gpu_codec_slots, gpu_engine, gpu_micro, gpu_table, ucx_kv_handoff, voice_prompt_probe
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


def test_engine_step_loop_with_in_memory_model_on_cpu(tmp_path):
    out = tmp_path / "engine.json"
    rc = gpu_engine.main(["--out", str(out), "--device", "cpu", "--preset", "tiny", "--dtype", "float32",
                          "--batch-sizes", "2", "--steps", "1", "--warmup", "0"])
    report = json.loads(out.read_text())
    assert rc == 0 and [row["batch"] for row in report["results"]] == [2]
    assert report["results"][0]["frames_per_s"] > 0
    assert gpu_table.tables(report)[-1].startswith("| 2 |")


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


def test_voice_prompt_probe_counts_the_host_ops_on_cpu(tmp_path):
    out = tmp_path / "voice.json"
    rc = voice_prompt_probe.main(["--out", str(out), "--preset", "tiny", "--device", "cpu", "--dtype", "float32",
                                  "--seconds", "2", "--reps", "1"])
    results = {row["mode"]: row for row in json.loads(out.read_text())["results"]}
    assert rc == 0 and set(results) == {"in_context", "x_vector_only"}
    # The codec encoder's work comes on top of the speaker encoder's; no kernels are counted off CUDA.
    assert results["in_context"]["host_ops"] > results["x_vector_only"]["host_ops"] > 50, results
    assert results["x_vector_only"]["top_host_ops"]["aten::conv1d"] > 10 and "launches" not in results["in_context"]


def test_launch_split_times_both_kinds_of_step_and_puts_everything_back(tmp_path):
    from loadtest.gpu import launch_split
    from services.engine import runner

    build, start = runner.build_attention_batch, runner.LaunchedStep.__dict__["start"]
    interval = sys.getswitchinterval()
    out = tmp_path / "launch.json"
    rc = launch_split.main(["--out", str(out), "--preset", "tiny", "--dtype", "float32", "--device", "cpu",
                            "--steps", "3", "--switch-interval-ms", "0.1"])
    report = json.loads(out.read_text())
    assert rc == 0 and [run["busy_thread"] for run in report["results"]] == [False, True]
    for run in report["results"]:
        for kind in ("decode", "mixed"):
            assert run[kind]["launch"] > 0 and run[kind]["_talker"] > 0, (kind, run)
    alone = report["results"][0]
    # A mixed step seats a new request (its penalty row, its parameters): more aten calls than a decode-only one.
    assert alone["mixed"]["aten_ops"] > alone["decode"]["aten_ops"] > 0
    assert runner.build_attention_batch is build and runner.LaunchedStep.__dict__["start"] is start
    assert sys.getswitchinterval() == interval


def test_gemm_choice_names_each_projection_shape_the_engine_runs_once(tmp_path):
    from loadtest.gpu.gemm_choice import weight_shapes
    from loadtest.gpu.gpu_models import build_model, write_config_files
    from services.model.layers import fuse_projections

    model = build_model(write_config_files(tmp_path / "tiny", "tiny"), torch.device("cpu"), torch.float32)
    for module in (model.talker, model.code_predictor):
        fuse_projections(module)  # as the loader does on CUDA
    shapes = weight_shapes(model)
    talker = model.config.talker
    expected: dict[tuple[int, int], int] = {}
    for decoder in (talker.decoder, talker.code_predictor.decoder):
        q_width, kv_width = decoder.num_heads * decoder.head_dim, decoder.num_kv_heads * decoder.head_dim
        for shape in ((q_width + 2 * kv_width, decoder.hidden_size), (decoder.hidden_size, q_width),
                      (2 * decoder.intermediate_size, decoder.hidden_size),
                      (decoder.hidden_size, decoder.intermediate_size)):
            expected[shape] = expected.get(shape, 0) + decoder.num_layers
    # the fused q/k/v and gate/up weights, never their parts; each layer's projections named once
    assert all(len(shapes.get(shape, [])) >= count for shape, count in expected.items()), (expected, shapes)
    assert not any(name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
                   for names in shapes.values() for name in names), shapes


def test_skinny_linear_sweep_offers_only_launch_shapes_that_fit_its_weights():
    from loadtest.gpu.skinny_linear_sweep import SHAPES, candidate_configs
    from services.kernels.skinny_linear import fits

    for out_features, in_features in SHAPES:
        configs = candidate_configs(out_features, in_features)
        x = torch.zeros((64, in_features), dtype=torch.bfloat16)
        weight = torch.zeros((out_features, in_features), dtype=torch.bfloat16)
        assert configs and all(fits(x, weight, config) for config in configs), (out_features, in_features)
        # a reduction split in up to 8 where the outputs are too few to fill the card unsplit, else in up to 2
        assert max(config.split_k for config in configs) == (8 if out_features <= 2048 else 2)


def test_commit_ab_refuses_a_budget_too_small_for_its_meshes(tmp_path):
    # A mesh cut short by its deadline gives no row, only spent device time (2026-12-04: five meshes at 90-107 s).
    repo = Path(__file__).resolve().parents[1]
    env = {"PATH": "/usr/bin:/bin", "BUDGET_S": "300", "WHEELS": "none", "OUT": str(tmp_path)}
    run = subprocess.run(["bash", "loadtest/gpu/commit_ab.sh", "no_tree_a", "no_tree_b", "2"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "leaves 75 s a run for 4 runs" in run.stdout
    assert list(tmp_path.iterdir()) == []  # no mesh was started
