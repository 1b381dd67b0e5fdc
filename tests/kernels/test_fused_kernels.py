"""The fused RMSNorm, norm + RoPE and silu-multiply kernels against the torch expressions they replace on CUDA.

The kernels are chosen by device (CUDA with Triton); on the CPU they run under Triton's interpreter, which is
chosen when Triton is imported, so that check runs in a fresh process with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.triton_interpreter import interpreted


@torch.no_grad()
def compare(device: str, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Largest differences of the kernels from the torch expressions, on fresh random inputs (the keyed Gumbel
    noise's hash is checked draw for draw in test_fused_draw.py)."""
    from services.kernels.fused_rms_norm import rms_norm
    from services.model.layers import RMSNorm

    generator = torch.Generator().manual_seed(3)
    worst_norm = 0.0
    for shape in ((5, 48), (3, 4, 16), (7, 1000)):  # a row, heads of a row, a width that is no power of two
        norm = RMSNorm(shape[-1], 1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(shape[-1], generator=generator))
        x = torch.randn(shape, generator=generator).to(device, dtype)
        norm = norm.to(device, dtype)
        expected = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        expected = (norm.weight * expected.to(dtype)).float()
        got = rms_norm(x, norm.weight.detach(), 1e-6).float()
        worst_norm = max(worst_norm, float((got - expected).abs().max() / expected.abs().max()))
    return {"rms_norm": worst_norm, "norm_rope": _norm_rope_error(device, dtype, generator),
            "silu_mul": _silu_mul_error(device, dtype, generator),
            "add_rms_norm": _add_rms_norm_error(device, dtype, generator),
            "deferred_stack": _deferred_stack_error(device, dtype, generator)}


def _add_rms_norm_error(device: str, dtype: torch.dtype, generator: torch.Generator) -> float:
    """Largest relative difference of the fused residual add + norm from `x + delta` then the norm (the sum must be
    the add's exactly: it is the residual stream the next layer reads)."""
    from services.kernels.fused_rms_norm import add_rms_norm
    from services.model.layers import RMSNorm

    worst = 0.0
    for shape in ((5, 48), (2, 3, 1000)):
        norm = RMSNorm(shape[-1], 1e-6)
        norm.weight.copy_(torch.randn(shape[-1], generator=generator))
        norm = norm.to(device, dtype)
        x, delta = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(2))
        total, normed = add_rms_norm(x, delta, norm.weight, norm.eps)
        assert torch.equal(total, x + delta), "the fused add must round as torch's add does"
        plain = x + delta
        expected = (norm.weight * (plain.float() * torch.rsqrt(plain.float().pow(2).mean(-1, keepdim=True)
                                                                + 1e-6)).to(dtype)).float()
        worst = max(worst, float((normed.float() - expected).abs().max() / expected.abs().max()))
    return worst


def _deferred_stack_error(device: str, dtype: torch.dtype, generator: torch.Generator) -> float:
    """Largest relative difference of a decoder stack run layer by layer with the residual adds deferred into the
    norms (`DecoderLayer.forward_deferred`, the path on CUDA) from the plain layers (two layers, dense attention)."""
    from services.model.config import DecoderConfig
    from services.kernels.fused_rms_norm import add_rms_norm
    from services.model.layers import DecoderStack

    cfg = DecoderConfig(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, hidden_act="silu")
    stack = DecoderStack(cfg)
    for parameter in stack.parameters():
        parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    stack = stack.to(device, dtype)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                                               v.transpose(0, 1), is_causal=True, enable_gqa=True)
        return out.transpose(0, 1)

    x = torch.randn((7, 64), generator=generator).to(device, dtype)
    rope = stack.rope.tables(torch.arange(7, device=device), dtype)
    plain = x
    for index, layer in enumerate(stack.layers):
        plain = layer(plain, rope, index, attend)
    expected = stack.norm(plain).float()
    stream, pending = x, None
    for index, layer in enumerate(stack.layers):
        stream, pending = layer.forward_deferred(stream, pending, rope, index, attend)
    got = add_rms_norm(stream, pending, stack.norm.weight, stack.norm.eps)[1].float()
    return float((got - expected).abs().max() / expected.abs().max())


def _silu_mul_error(device: str, dtype: torch.dtype, generator: torch.Generator) -> float:
    """Largest relative difference of the fused `silu(gate) * up` from the torch form, rows of a fused gate/up
    output (a width over one block, and one that is no power of two)."""
    from services.kernels.fused_silu_mul import silu_mul

    worst = 0.0
    for shape in ((3, 2 * 1500), (2, 2, 2 * 40)):
        gate_up = (3 * torch.randn(shape, generator=generator)).to(device, dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        expected = (torch.nn.functional.silu(gate) * up).float()
        got = silu_mul(gate_up).float()
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    return worst


def _norm_rope_error(device: str, dtype: torch.dtype, generator: torch.Generator) -> float:
    """Largest relative difference of the fused norm + RoPE from the torch form: a talker-shaped step (one position
    per token, read from a strided column as the padded step's metadata keeps them) and a code-predictor-shaped one
    (rows repeating two positions), positions up to 4000."""
    from services.kernels.fused_norm_rope import norm_rope
    from services.model.layers import RMSNorm, Rope, apply_rope

    worst = 0.0
    cases = (((6, 4, 32), torch.tensor([0, 1, 7, 300, 2048, 4000])), ((3, 2, 2, 16), torch.arange(2)))
    for (shape, positions), sliced in ((case, sliced) for case in cases for sliced in (False, True)):
        head_dim = shape[-1]
        norm = RMSNorm(head_dim, 1e-6)
        norm.weight.copy_(torch.randn(head_dim, generator=generator))
        norm = norm.to(device, dtype)
        x = torch.randn(shape, generator=generator).to(device, dtype)
        if sliced:  # heads in the first columns of a wider row, as q is in the fused q/k/v output
            wide = torch.randn((*shape[:-2], 3 * shape[-2] * head_dim), generator=generator).to(device, dtype)
            wide[..., : shape[-2] * head_dim] = x.flatten(-2)
            x = wide[..., : shape[-2] * head_dim].view(shape)
        rope = Rope(head_dim, 1_000_000.0)
        positions = torch.stack([positions, -positions], dim=1).to(device)[:, 0]  # a column of a [P, 2] tensor
        cos, sin = Rope.tables_of(positions, rope.inv_freq(positions.device), dtype)
        expected = apply_rope(norm(x), cos, sin).float()
        got = norm_rope(x, norm.weight, norm.eps, positions, rope.inv_freq(positions.device)).float()
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    return worst


def test_fused_kernels_equal_the_torch_expressions_under_the_interpreter():
    worst = interpreted("tests.kernels.test_fused_kernels.compare('cpu')")
    assert worst["rms_norm"] < 1e-6 and worst["norm_rope"] < 1e-5, worst
    assert worst["silu_mul"] < 1e-6 and worst["add_rms_norm"] < 1e-6 and worst["deferred_stack"] < 1e-5, worst


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a CUDA device")
def test_fused_kernels_equal_the_torch_expressions_on_cuda():
    worst = compare("cuda")
    assert worst["rms_norm"] < 1e-6 and worst["norm_rope"] < 1e-5, worst
    assert worst["silu_mul"] < 1e-6 and worst["add_rms_norm"] < 1e-6 and worst["deferred_stack"] < 1e-5, worst
    in_bf16 = compare("cuda", torch.bfloat16)
    assert in_bf16["rms_norm"] < 1e-2 and in_bf16["norm_rope"] < 2e-2 and in_bf16["silu_mul"] < 1e-2, in_bf16
    assert in_bf16["add_rms_norm"] < 1e-2 and in_bf16["deferred_stack"] < 1e-6, in_bf16
