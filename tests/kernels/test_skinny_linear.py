"""The skinny-GEMM kernel and the deferred projections (`services/kernels/skinny_linear.py`): the kernel against torch's
GEMM, the norm that adds a projection's partial sums against the one that adds its rounded output, and decoder layers
run with their o_proj and down_proj deferred against the same layers without. Under Triton's interpreter on the CPU
(a fresh process: see tests/support/triton_interpreter.py), and compiled on CUDA where there is one."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tests.support.triton_interpreter import interpreted

SHAPES = ((1, 64, 256), (5, 128, 512), (16, 64, 1024), (64, 96, 512), (40, 32, 2048))
"""(rows, out, in): one row, a few, a full small tile, a decode batch of 64, rows that fill no power of two."""


@torch.no_grad()
def compare_kernel(device: str, dtype_name: str) -> dict[str, object]:
    """The largest difference of the kernel's product from torch's, relative to its largest value, over SHAPES and
    launch shapes with and without a split reduction; and whether the partial sums add up to the unsplit product."""
    from services.kernels.skinny_linear import SkinnyConfig, fits, launch, partial_sums

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(3)
    worst, splits_add_up, launched = 0.0, True, 0
    for rows, out_features, in_features in SHAPES:
        x = torch.randn((rows, in_features), generator=generator).to(device, dtype)
        weight = (torch.randn((out_features, in_features), generator=generator) * in_features**-0.5).to(device, dtype)
        expected = F.linear(x.float(), weight.float())
        for config in (SkinnyConfig(block_n=32, block_k=64, split_k=1), SkinnyConfig(block_n=32, block_k=64, split_k=2),
                       SkinnyConfig(block_n=32, block_k=128, split_k=4)):
            if not fits(x, weight, config):
                continue
            launched += 1
            got = launch(x, weight, config).float()
            worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
            summed = partial_sums(x, weight, config).partials.sum(0)
            splits_add_up &= bool(torch.allclose(summed, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max())))
    return {"worst": worst, "splits_add_up": splits_add_up, "launched": launched}


@torch.no_grad()
def compare_split_norm(device: str, dtype_name: str) -> dict[str, object]:
    """`add_rms_norm` given partial sums against `add_rms_norm` given their sum rounded to the dtype (what a GEMM
    returns): equal to the last bit, residual stream and normed rows."""
    from services.kernels import fused_rms_norm
    from services.kernels.skinny_linear import DEFERRED, partial_sums

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(4)
    equal = True
    for rows, in_features in ((1, 512), (7, 1024), (64, 512)):
        width = 96
        x = torch.randn((2, rows, width), generator=generator).to(device, dtype)
        heads = torch.randn((2, rows, in_features), generator=generator).to(device, dtype)
        weight = (torch.randn((width, in_features), generator=generator) * in_features**-0.5).to(device, dtype)
        norm_weight = (1 + 0.1 * torch.randn(width, generator=generator)).to(device, dtype)
        split = partial_sums(heads, weight, DEFERRED)
        summed = split.partials[0]
        for partial in split.partials[1:]:  # in the kernel's order: float32 adds, one split after another
            summed = summed + partial
        rounded = summed.to(dtype).view(x.shape)
        total, normed = fused_rms_norm.add_rms_norm(x, split, norm_weight, 1e-6)
        want_total, want_normed = fused_rms_norm.add_rms_norm(x, rounded, norm_weight, 1e-6)
        equal &= bool(torch.equal(total, want_total)) and bool(torch.equal(normed, want_normed))
    return {"equal": equal}


@torch.no_grad()
def compare_layers(device: str, dtype_name: str) -> dict[str, object]:
    """Three decoder layers and the final norm run deferred (the CUDA path) with the split kernel made to serve o_proj
    and down_proj, then also the gated kernel the MLP's gate/up, against the same with both off: the partial sums
    handed on, the gated launches, and the largest differences of the final hidden states relative to their largest
    value."""
    from services.kernels import skinny_linear
    from services.model.config import DecoderConfig
    from services.model.layers import DecoderStack, fuse_projections

    dtype = getattr(torch, dtype_name)
    cfg = DecoderConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=128,
                        intermediate_size=512, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
                        attention_bias=False)
    torch.manual_seed(12)
    stack = DecoderStack(cfg)
    for parameter in stack.parameters():
        parameter.normal_(0.0, 0.2)  # norms' weights included: not all ones
    stack = stack.to(device, dtype)
    fuse_projections(stack)  # after the move: the fused weights are plain tensors, which `to` leaves where they are
    x = torch.randn(6, 2, 128, device=device).to(dtype)
    positions = torch.arange(2, device=device)

    def attend(layer, q, k, v):
        groups = q.shape[-2] // k.shape[-2]
        k, v = (t.repeat_interleave(groups, dim=-2) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                             v.transpose(1, 2).float(), is_causal=True)
        return out.transpose(1, 2).to(q.dtype)

    served, served_gated = skinny_linear.serves, skinny_linear.serves_gated
    made, gated = [], []

    def counted(x, weight, bias):
        serving = bias is None and skinny_linear.fits(x, weight, skinny_linear.DEFERRED, skinny_linear.MAX_ROWS)
        if serving:
            made.append(tuple(weight.shape))
        return serving

    import services.model.layers as layers
    compiles = layers.compiles_for
    layers.compiles_for = lambda device: True  # the deferred (fused-norm) path of the CUDA build
    def gated_counted(x, gate_up):
        serving = skinny_linear.fits(x, gate_up, skinny_linear.GATED, skinny_linear.MAX_ROWS)
        gated.append(serving)
        return serving

    try:
        skinny_linear.serves = lambda x, weight, bias: False
        skinny_linear.serves_gated = lambda x, gate_up: False
        plain = stack(x, positions, attend)
        skinny_linear.serves = counted
        deferred = stack(x, positions, attend)
        skinny_linear.serves_gated = gated_counted
        with_gated = stack(x, positions, attend)
    finally:
        skinny_linear.serves, skinny_linear.serves_gated, layers.compiles_for = served, served_gated, compiles
    scale = plain.float().abs().max()
    return {"error": float((deferred.float() - plain.float()).abs().max() / scale),
            "gated_error": float((with_gated.float() - plain.float()).abs().max() / scale),
            "gated": sum(gated), "deferred": sorted(list(shape) for shape in set(made)), "count": len(made)}


@torch.no_grad()
def compare_gated(device: str, dtype_name: str) -> dict[str, object]:
    """The gated kernel against the two launches it replaces (the gate/up GEMM, then `silu(gate) * up`): the largest
    difference relative to the largest value, over row counts of one, a few and a decode batch."""
    from services.kernels.skinny_linear import GATED, fits, gated_silu

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(6)
    worst, launched = 0.0, 0
    for rows, width, in_features in ((1, 64, 256), (9, 96, 512), (32, 128, 256)):  # x holds 2 x rows
        x = torch.randn((2, rows, in_features), generator=generator).to(device, dtype)
        gate_up = (torch.randn((2 * width, in_features), generator=generator) * in_features**-0.5).to(device, dtype)
        if not fits(x, gate_up, GATED):
            continue
        launched += 1
        projected = F.linear(x.float(), gate_up.float()).to(dtype).float()
        gate, up = projected.chunk(2, dim=-1)
        expected = (F.silu(gate).to(dtype).float() * up).to(dtype).float()
        got = gated_silu(x, gate_up).float()
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    return {"worst": worst, "launched": launched}


def test_the_kernel_equals_torchs_gemm_under_the_interpreter():
    # float16, not bfloat16: the interpreter's numpy has no bfloat16; the CUDA test below checks bfloat16 compiled
    for dtype, tolerance in (("float32", 1e-5), ("float16", 2e-3)):
        report = interpreted(f"tests.kernels.test_skinny_linear.compare_kernel('cpu', '{dtype}')")
        assert report["launched"] >= 10, report
        assert report["splits_add_up"], (dtype, report)
        assert report["worst"] < tolerance, (dtype, report)


def test_the_norm_adds_partial_sums_as_it_adds_their_rounded_sum_under_the_interpreter():
    for dtype in ("float32", "float16"):
        assert interpreted(f"tests.kernels.test_skinny_linear.compare_split_norm('cpu', '{dtype}')") == {"equal": True}


def test_deferred_projections_leave_the_layers_outputs_unchanged_under_the_interpreter():
    report = interpreted("tests.kernels.test_skinny_linear.compare_layers('cpu', 'float32')")
    # o_proj and down_proj (both 128 x 512) of each of the three layers went to the norms as partial sums
    assert report["deferred"] == [[128, 512]], report
    assert report["count"] == 12, report  # six with the plain MLP, six with the gated one
    assert report["error"] < 1e-5 and report["gated_error"] < 1e-5, report
    assert report["gated"] == 3, report


def test_the_gated_kernel_equals_the_projection_then_the_activation_under_the_interpreter():
    for dtype, tolerance in (("float32", 1e-5), ("float16", 4e-3)):
        report = interpreted(f"tests.kernels.test_skinny_linear.compare_gated('cpu', '{dtype}')")
        assert report["launched"] == 3 and report["worst"] < tolerance, (dtype, report)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need CUDA")
def test_the_compiled_kernels_equal_the_torch_forms_on_cuda():
    report = compare_kernel("cuda", "bfloat16")
    assert report["splits_add_up"] and report["worst"] < 0.02, report
    split_norm = compare_split_norm("cuda", "bfloat16")
    assert split_norm == {"equal": True}, split_norm
    layers = compare_layers("cuda", "bfloat16")
    assert layers["count"] == 12 and layers["gated"] == 3, layers
    assert layers["error"] < 0.03 and layers["gated_error"] < 0.03, layers
    gated = compare_gated("cuda", "bfloat16")
    assert gated["launched"] == 3 and gated["worst"] < 0.02, gated
