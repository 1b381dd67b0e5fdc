"""The code predictor's attention in torch (the path off CUDA, and the reference of the fused kernel,
`kernels.fused_small_attention`), and the start-up check that compares the two on the model's device."""

from __future__ import annotations

import logging

import torch
from torch.nn import functional as F

from services.kernels import fused_small_attention
from services.kernels.fused_small_attention import HeadNorms
from services.model.layers import Rope, apply_rope

log = logging.getLogger(__name__)


def torch_form(cache: torch.Tensor, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
    """What `small_attention` computes, in torch (the path off CUDA, and the check's reference)."""
    num_new = q.shape[1]
    end = start + num_new
    cache[0, :, :, start:end] = k.transpose(1, 2)
    cache[1, :, :, start:end] = v.transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), cache[0, :, :, :end], cache[1, :, :, :end], is_causal=start == 0 and num_new > 1,
        scale=scale, enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2)


def reference_heads(qkv: torch.Tensor, num_heads: int, head_dim: int,
                    norms: HeadNorms) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q and k [B, n, H, D] normed and rotated by the torch form (the layers' arithmetic), and v, from qkv [B, n,
    width]: what `small_attention_projected` reads, made the way the layer made it before."""
    kv_width = (qkv.shape[-1] - num_heads * head_dim) // 2
    q, k, v = (part.view(*qkv.shape[:2], -1, head_dim)
               for part in qkv.split((num_heads * head_dim, kv_width, kv_width), dim=-1))
    cos, sin = Rope.tables_of(norms.positions, norms.inv_freq, qkv.dtype)

    def normed_rotated(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm
        wide = x.float()
        return apply_rope(weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), cos, sin)

    return normed_rotated(q, norms.q_norm), normed_rotated(k, norms.k_norm), v


def check(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, max_len: int) -> bool:
    """Run both kernel forms once against the torch form on `device` (at load time, before any graph is captured), on
    small random inputs: the verdict, for the caller to keep. False (logged) on an error or a difference past the
    dtype's tolerance: the torch form serves there. The loader runs it where the kernels compile (CUDA); it is
    device-agnostic itself."""
    generator = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn((3, 2, (heads + 2 * kv_heads) * head_dim), generator=generator, device=device).to(dtype)
    norm_weights = [1 + 0.5 * torch.randn(head_dim, generator=generator, device=device).to(dtype) for _ in range(2)]
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    scale, worst = head_dim**-0.5, 0.0
    try:
        plain, projected, torch_cache = (torch.zeros((2, 3, kv_heads, max_len, head_dim), dtype=dtype, device=device)
                                         for _ in range(3))
        # The steps the code predictor runs: two tokens at position 0, then one that reads them from the cache. (A
        # later step of two tokens is no case of it: the torch form is not causal there, the kernel is.)
        for start, num_new in ((0, 2), (2, 1)):
            step = qkv[:, :num_new]
            norms = HeadNorms((norm_weights[0], 1e-6), (norm_weights[1], 1e-6),
                              torch.arange(start, start + num_new, device=device), inv_freq)
            q, k, v = reference_heads(step, heads, head_dim, norms)
            want = torch_form(torch_cache, start, q, k, v, scale)
            for got, cache in ((fused_small_attention.small_attention(plain, start, q, k, v, scale), plain),
                               (fused_small_attention.small_attention_projected(projected, start, step, heads, norms, scale), projected)):
                worst = max(worst, relative(got, want), relative(cache, torch_cache))
    except Exception:  # noqa: BLE001 - a kernel that cannot run here must not take the replica down
        log.exception("the fused code-predictor attention failed its start-up check on %s; the torch form serves",
                      device)
        return False
    # bfloat16: q and k rounded a step apart move the softmax by a few percent; a wrong kernel is off by its whole size
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    if worst > tolerance:
        log.warning("the fused code-predictor attention differs from the torch form by %.3g of its largest value on "
                    "%s (tolerance %g); the torch form serves", worst, device, tolerance)
        return False
    return True


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference over the largest value of `want`: the normed and rotated heads reach a few units, where
    bfloat16's rounding steps (which the kernel and torch's sin and cos take differently) are a few hundredths."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))
