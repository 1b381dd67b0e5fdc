"""The GPU benchmark scripts' code paths, run on the CPU with the tiny model for one tiny iteration.

No timing is asserted: these keep the scripts from rotting (every entry measured, no errors recorded, the
decode-only attention variant equal to `Talker.forward`, the hand-off's checks able to fail), and keep them measuring
what the services serve (the harness's models wired by the loaders' own functions, the kernel switches taken as the
services take their settings).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
import torch

from loadtest.gpu import gpu_codec_slots, gpu_micro, gpu_models, gpu_table, ucx_kv_handoff
from loadtest.gpu.gpu_common import capture_graph, count_flops, count_launches
from loadtest.gpu.ucx_kv_blocks import HandoffSpec, HandoffSpecError, block_contents, block_ids, same_bits
from services.model.codec.causal_conv import StreamingConv
from services.model.kernel_choices import KernelChoices
from services.model.layers import MLP
from tests.support.triton_interpreter import interpreted

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
        "--copy-mib", "1", "--gemm-size", "16", "--commit", "test", "--gated-gemm", "false",
    ])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == []
    # The model's record adds its start-up verdicts (none checked off the device path).
    assert report["kernels"] == {"choices": {"triton_conv": True, "gated_gemm": False},
                                 "verdicts": {"whole_row_sampler": False, "small_attention": False}}
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


def wiring(model) -> dict:
    """What the loader's kernel wiring leaves on a model: its start-up verdicts, the code predictor's attention
    switch, and each MLP's fused projection and gated-GEMM switch."""
    mlps = [m for module in (model.talker, model.code_predictor) for m in module.modules() if isinstance(m, MLP)]
    return {"verdicts": {"whole_row_sampler": model.kernels.whole_row_sampler,
                         "small_attention": model.kernels.small_attention},
            "fused_attention": model.code_predictor.fused_attention,
            "fused_mlps": sum(m.gate_up is not None for m in mlps), "mlps": len(mlps),
            "gated_gemm": sorted({m.gated_gemm for m in mlps})}


def loaded_and_built(checkpoint: str, gated_gemm: bool) -> list[dict]:
    """In the interpreter's process, where the kernels run on the CPU: the wiring of a model from `load_model` and of
    the device harness's random-weight model of the same config, both told `gated_gemm`. The loader is made to take
    its device path (as on CUDA) for the call, and put back after."""
    from services.model import loader

    choices, device_path = KernelChoices(gated_gemm=gated_gemm), loader.compiles_for
    loader.compiles_for = lambda device: True
    try:
        loaded = loader.load_model(checkpoint, choices=choices)
        built = gpu_models.build_model(Path(checkpoint), torch.device("cpu"), torch.float32, choices=choices)
    finally:
        loader.compiles_for = device_path
    return [wiring(loaded), wiring(built)]


@pytest.mark.parametrize("gated_gemm", [True, False])
def test_the_harness_model_is_wired_as_the_loader_wires_a_served_one(tiny_checkpoint, gated_gemm):
    loaded, built = interpreted(f"tests.kernels.test_gpu_scripts.loaded_and_built({str(tiny_checkpoint)!r}, "
                                f"{gated_gemm})")
    assert built == loaded
    assert built["verdicts"] == {"whole_row_sampler": True, "small_attention": True}  # the checks ran, and passed
    assert built["fused_attention"] is True
    assert built["fused_mlps"] == built["mlps"] > 0 and built["gated_gemm"] == [gated_gemm]


def test_off_the_device_path_the_harness_model_keeps_the_reference_form(tiny_checkpoint):
    built = wiring(gpu_models.build_model(tiny_checkpoint, torch.device("cpu"), torch.float32))
    assert built["verdicts"] == {"whole_row_sampler": False, "small_attention": False}
    assert built["fused_attention"] is False and built["fused_mlps"] == 0


@pytest.mark.parametrize("switched_on", [True, False])
def test_the_harness_codec_takes_the_triton_conv_choice(switched_on):
    decoder = gpu_models.build_codec("tiny", torch.device("cpu"), torch.float32,
                                     choices=KernelChoices(triton_conv=switched_on))
    convs = [m for m in decoder.modules() if isinstance(m, StreamingConv)]
    assert convs and all(conv.triton_conv is switched_on for conv in convs)
    assert not any(p.requires_grad for p in decoder.parameters())


def test_the_scripts_take_the_kernel_settings_as_the_services_do(monkeypatch):
    """The settings' flag wins over its variable, the variable over the default, as in a service."""
    parser = argparse.ArgumentParser()
    gpu_models.add_kernel_arguments(parser)
    assert gpu_models.kernel_choices(parser.parse_args([])) == KernelChoices(triton_conv=True, gated_gemm=True)
    monkeypatch.setenv("VOXMESH_GATED_GEMM", "0")
    assert gpu_models.kernel_choices(parser.parse_args([])) == KernelChoices(triton_conv=True, gated_gemm=False)
    chosen = gpu_models.kernel_choices(parser.parse_args(["--gated-gemm", "true", "--triton-conv", "false"]))
    assert chosen == KernelChoices(triton_conv=False, gated_gemm=True)
    with pytest.raises(SystemExit, match="--triton-conv / VOXMESH_TRITON_CONV: expected bool"):
        gpu_models.kernel_choices(parser.parse_args(["--triton-conv", "maybe"]))


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
                               "--commit", "test", "--triton-conv", "false"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == []
    assert report["kernels"] == {"choices": {"triton_conv": False, "gated_gemm": True}}
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
