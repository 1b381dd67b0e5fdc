"""The fused residual add + RMSNorm + projection (and SwiGLU) kernel against the torch operations it replaces: under
Triton's interpreter on the CPU (a fresh process: see tests/support/triton_interpreter.py), and on CUDA where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from tests.support.triton_interpreter import interpreted

SHAPES = ((1, 64, 96), (5, 200, 70), (64, 256, 96), (100, 128, 40))
"""(rows, input width, output width): one row, widths that are no multiple of the blocks, a full decode batch, the
code predictor's two-rows-a-request first pass (over 64 rows)."""


def _torch_form(x, delta, norm_weight, eps, weight, gated):
    """What the layer computes without the kernel: the add, the reference's norm, the GEMM (and silu * up)."""
    total = x if delta is None else x + delta
    normed = total.float() * torch.rsqrt(total.float().pow(2).mean(-1, keepdim=True) + eps)
    normed = norm_weight * normed.to(x.dtype)
    projected = F.linear(normed, weight)
    if not gated:
        return total, projected
    gate, up = projected.chunk(2, dim=-1)
    return total, F.silu(gate) * up


@torch.no_grad()
def compare(device: str, dtype_name: str) -> dict[str, object]:
    """For each mode (no residual, residual, gated): the largest difference from the torch form relative to its
    largest value, and whether every residual sum equals torch's add exactly."""
    from services.model.fused_norm_linear import add_norm_linear

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(5)
    worst = {"plain": 0.0, "residual": 0.0, "gated": 0.0}
    sums_equal = True
    for rows, width, out_width in SHAPES:
        def rand(*shape, scale=1.0):
            return (scale * torch.randn(shape, generator=generator)).to(device, dtype)

        x, delta, norm_weight = rand(rows, width), rand(rows, width), rand(width)
        for mode in worst:
            gated = mode == "gated"
            weight = rand(2 * out_width if gated else out_width, width, scale=width**-0.5)
            added = None if mode == "plain" else delta
            total, got = add_norm_linear(x, added, norm_weight, 1e-6, weight, gated=gated)
            expected_total, expected = _torch_form(x, added, norm_weight, 1e-6, weight, gated)
            sums_equal &= bool(torch.equal(total, expected_total))
            error = (got.float() - expected.float()).abs().max() / expected.float().abs().max()
            worst[mode] = max(worst[mode], float(error))
    return {"worst": worst, "sums_equal": sums_equal}


def test_the_kernel_equals_the_torch_form_under_the_interpreter():
    # float16, not bfloat16: the interpreter's numpy has no bfloat16 (its dot gives garbage there); the CUDA test
    # below checks bfloat16 compiled
    for dtype, tolerance in (("float32", 1e-5), ("float16", 0.005)):
        report = interpreted(f"tests.test_fused_norm_linear.compare('cpu', '{dtype}')")
        assert report["sums_equal"], (dtype, report)
        assert max(report["worst"].values()) < tolerance, (dtype, report)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs CUDA")
def test_the_compiled_kernel_equals_the_torch_form_on_cuda():
    for dtype in ("bfloat16", "float16"):
        report = compare("cuda", dtype)
        assert report["sums_equal"], (dtype, report)
        # one rounding of the normed row fewer than the torch form: bf16's step is 2^-8 of a value
        assert max(report["worst"].values()) < 0.03, (dtype, report)


def _attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over the given tokens only, kv heads shared by groups of query heads (q [B, n, Hq, D])."""
    groups = q.shape[-2] // k.shape[-2]
    k, v = (t.repeat_interleave(groups, dim=-2) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), is_causal=True)
    return out.transpose(1, 2).to(q.dtype)


@torch.no_grad()
def compare_layers(device: str) -> dict[str, object]:
    """Three decoder layers run deferred (the CUDA path), with the kernel made to serve here and with it off: the
    launches it took and the largest difference of the streams and MLP outputs, in float32."""
    from services.model import fused_norm_linear
    from services.model.config import DecoderConfig
    from services.model.layers import DecoderLayer, FusedRope, Rope, fuse_projections

    cfg = DecoderConfig(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=96, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
                        attention_bias=False)
    torch.manual_seed(11)
    layers = [DecoderLayer(cfg) for _ in range(cfg.num_layers)]
    for layer in layers:
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.2)  # norms' weights included: not all ones
        fuse_projections(layer)
    x = torch.randn(6, 2, 64, device=device)
    rope = FusedRope(torch.arange(2, device=device), Rope(16, 10000.0).inv_freq(torch.device(device)))
    calls = []
    kernel = fused_norm_linear.add_norm_linear

    def counted(*args, **kwargs):
        calls.append(kwargs.get("gated", False))
        return kernel(*args, **kwargs)

    def run(serve: bool):
        fused_norm_linear.serves = lambda x, weight: serve
        fused_norm_linear.add_norm_linear = counted
        stream, pending = x, None
        for index, layer in enumerate(layers):
            stream, pending = layer.forward_deferred(stream, pending, rope, index, _attend)
        return stream, pending

    fused_stream, fused_pending = run(True)
    launches = list(calls)
    plain_stream, plain_pending = run(False)
    return {"launches": launches, "calls_when_off": len(calls) - len(launches),
            "stream": float((fused_stream - plain_stream).abs().max()),
            "pending": float((fused_pending - plain_pending).abs().max() / plain_pending.abs().max())}


def test_the_layers_take_the_kernel_twice_each_and_compute_the_same():
    report = interpreted("tests.test_fused_norm_linear.compare_layers('cpu')")
    assert report["launches"] == [False, True] * 3, report  # the q/k/v projection, then the gated MLP, a layer
    assert report["calls_when_off"] == 0, report
    assert report["stream"] < 1e-4 and report["pending"] < 1e-4, report


def test_bad_shapes_are_refused_with_what_was_given():
    from services.model.fused_norm_linear import MAX_ROWS, add_norm_linear

    x, norm = torch.zeros(2, 8), torch.ones(8)
    with pytest.raises(ValueError, match="do not fit together"):
        add_norm_linear(x, None, norm, 1e-6, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="is not like x"):
        add_norm_linear(x, torch.zeros(3, 8), norm, 1e-6, torch.zeros(4, 8))
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        add_norm_linear(torch.zeros(MAX_ROWS + 1, 8), None, norm, 1e-6, torch.zeros(4, 8))


def test_the_kernel_is_off_unless_asked_for():
    # Measured slower than the GEMM library on the H200 (loadtest/RESULTS-GPU.md): the serving path must not take it
    # by default.
    done = subprocess.run([sys.executable, "-c", "from services.model import fused_norm_linear as f; print(f.ENABLED)"],
                          env={k: v for k, v in os.environ.items() if k != "VOXMESH_FUSED_NORM_LINEAR"},
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_the_block_sweep_runs_and_reports_each_choice(tmp_path):
    out = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, "-m", "loadtest.gpu.fused_norm_linear_sweep", "--out", str(out),
                           "--device", "cpu"], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [row["projection"] for row in report["results"]] == ["qkv", "gate_up"]
    for row in report["results"]:
        assert row["unfused_ms"] > 0 and row["best"]["ms"] > 0, row
        assert row["best"]["rel_error"] < 1e-5, row  # float32: the fused result is the unfused one
