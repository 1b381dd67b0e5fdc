"""The code predictor's attention as one Triton kernel on CUDA: write the new keys and values into the dense cache
and attend over at most 16 cached tokens, in one launch per layer and step.

The torch form is two cache writes (strided copies), the attention (a few launches) and a copy of its transposed
output, five or more launches in each of the 5 layers of each of the 15 steps of a frame: a quarter of the frame's
launches for a few kilobytes of work. One program per (row, query head) reads its kv head's cached keys and values
(positions before `start`) and the new ones straight from the inputs (so no program reads what another writes in
the same launch), applies the causal mask, softmax in float32, and writes its output rows, laid out as the layer
reads them; the first program of each kv head group stores the new keys and values in the cache for later steps.
`small_attention_projected` takes the fused q/k/v projection's output instead and norms and rotates q and k itself
(`fused_qk_norm_rope.norm_rope_head`, the same arithmetic as the separate launch): one launch a layer, not two.

Off CUDA the torch form serves; the CPU tests check this kernel under Triton's interpreter. Where it runs, the loader
checks it once against the torch form on the model's device (`check`) and falls back to the torch form, saying so,
should it fail there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from services.model.triton_support import tl, triton

log = logging.getLogger(__name__)

NUM_WARPS = 1
"""Warps per program (one row and query head: a [16, head_dim] tile); loadtest/gpu/small_attention_warps.py times
the choices on the GPU."""

_refused: set[tuple[str, torch.dtype]] = set()
"""(device, dtype) where the start-up check failed: the torch form serves there."""

if triton is not None:
    from services.model.fused_qk_norm_rope import norm_rope_head

    @triton.jit
    def _small_attention_kernel(q_ptr, k_ptr, v_ptr, cache_ptr, out_ptr, start, scale,
                                stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                                stride_vb, stride_vn, stride_vh, stride_cache_kv, stride_cache_b, stride_cache_h,
                                stride_cache_s, stride_ob, stride_on, stride_oh,
                                q_weight_ptr, k_weight_ptr, q_eps, k_eps, positions_ptr, inv_freq_ptr,
                                NUM_NEW: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                MAX_LEN: tl.constexpr, PROJECTED: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        dims = tl.arange(0, HEAD_DIM)
        positions = tl.arange(0, MAX_LEN)
        is_cached = positions < start
        cache_keys = cache_ptr + row * stride_cache_b + kv_head * stride_cache_h
        cache_at = positions[:, None] * stride_cache_s + dims[None, :]
        keys = tl.load(cache_keys + cache_at, mask=is_cached[:, None], other=0.0)
        values = tl.load(cache_keys + stride_cache_kv + cache_at, mask=is_cached[:, None], other=0.0)
        # The new entries come from the inputs, not the cache: no program reads what another writes in this launch.
        for token in tl.static_range(NUM_NEW):
            key_ptr = k_ptr + row * stride_kb + token * stride_kn + kv_head * stride_kh
            if PROJECTED:
                position = tl.load(positions_ptr + token).to(tl.float32)
                key = norm_rope_head(key_ptr, k_weight_ptr, k_eps, position, inv_freq_ptr, out_ptr, HEAD_DIM,
                                     HEAD_DIM // 2)
            else:
                key = tl.load(key_ptr + dims)
            value = tl.load(v_ptr + row * stride_vb + token * stride_vn + kv_head * stride_vh + dims)
            is_this = (positions == start + token)[:, None]
            keys = tl.where(is_this, key[None, :].to(keys.dtype), keys)
            values = tl.where(is_this, value[None, :].to(values.dtype), values)
            if head % GROUP == 0:  # one program per kv head stores the new entries, for later steps
                tl.store(cache_keys + (start + token) * stride_cache_s + dims, key.to(keys.dtype))
                tl.store(cache_keys + stride_cache_kv + (start + token) * stride_cache_s + dims,
                         value.to(values.dtype))
        keys = keys.to(tl.float32)
        values = values.to(tl.float32)
        for token in tl.static_range(NUM_NEW):
            query_ptr = q_ptr + row * stride_qb + token * stride_qn + head * stride_qh
            if PROJECTED:
                position = tl.load(positions_ptr + token).to(tl.float32)
                query = norm_rope_head(query_ptr, q_weight_ptr, q_eps, position, inv_freq_ptr, out_ptr, HEAD_DIM,
                                       HEAD_DIM // 2).to(tl.float32)
            else:
                query = tl.load(query_ptr + dims).to(tl.float32)
            scores = tl.sum(keys * query[None, :], axis=1) * scale
            scores = tl.where(positions <= start + token, scores, float("-inf"))  # causal, within the tokens so far
            weights = tl.exp(scores - tl.max(scores, axis=0))
            weights = weights / tl.sum(weights, axis=0)
            out = tl.sum(weights[:, None] * values, axis=0)
            tl.store(out_ptr + row * stride_ob + token * stride_on + head * stride_oh + dims,
                     out.to(out_ptr.dtype.element_ty))


def small_attention(cache: torch.Tensor, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """Attention of q [B, n, Hq, D] over the first `start` entries of `cache` [2, B, Hkv, S, D] (one layer's keys and
    values) and the n new ones k, v [B, n, Hkv, D], causally; stores k, v at positions start..start+n of the cache.
    Returns [B, n, Hq, D] (contiguous)."""
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"small_attention needs dense heads, got strides {q.stride()}, {k.stride()}, {v.stride()}")
    return _launch(cache, start, q, k, v, scale, num_warps, None)


@dataclass(frozen=True, slots=True)
class HeadNorms:
    """What the one-launch form norms and rotates q and k with: each RMS norm's (weight, eps) and the RoPE inputs."""

    q_norm: tuple[torch.Tensor, float]
    k_norm: tuple[torch.Tensor, float]
    positions: torch.Tensor
    """[n]: the new tokens' positions."""
    inv_freq: torch.Tensor


def small_attention_projected(cache: torch.Tensor, start: int, qkv: torch.Tensor, num_heads: int, norms: HeadNorms,
                              scale: float, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """`small_attention` straight from the fused q/k/v projection's output qkv [B, n, (Hq + 2 * Hkv) * D]: q and k
    RMS-normed and rotated in the same launch, with `qk_norm_rope`'s arithmetic (`norm_rope_head`), so a layer of the
    code predictor spends one launch on its attention instead of two."""
    kv_heads, head_dim = cache.shape[2], cache.shape[4]
    q_width, kv_width = num_heads * head_dim, kv_heads * head_dim
    if qkv.dim() != 3 or qkv.shape[-1] != q_width + 2 * kv_width or qkv.stride(-1) != 1:
        raise ValueError(f"small_attention_projected needs qkv [B, n, {q_width + 2 * kv_width}] with dense rows, got "
                         f"{tuple(qkv.shape)} strides {qkv.stride()}")
    if norms.positions.shape != (qkv.shape[1],) or not norms.positions.is_contiguous():
        raise ValueError(f"one position per new token is needed, got {tuple(norms.positions.shape)}")
    weights = (norms.q_norm[0], norms.k_norm[0])
    if any(weight.dtype != qkv.dtype or weight.shape != (head_dim,) for weight in weights):
        raise ValueError(f"the q and k norm weights must be [{head_dim}] in {qkv.dtype}")
    heads = (*qkv.shape[:2], -1, head_dim)
    q, k, v = (part.view(heads) for part in qkv.split((q_width, kv_width, kv_width), dim=-1))
    return _launch(cache, start, q, k, v, scale, num_warps, norms)


def _launch(cache: torch.Tensor, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            num_warps: int, norms: HeadNorms | None) -> torch.Tensor:
    rows, num_new, heads, head_dim = q.shape
    kv_heads, max_len = cache.shape[2], cache.shape[3]
    if start + num_new > max_len:
        raise ValueError(f"the code predictor's cache holds {max_len} tokens, not {start} + {num_new}")
    out = torch.empty((rows, num_new, heads, head_dim), dtype=q.dtype, device=q.device)
    # Without norms the norm arguments are never read (PROJECTED is off): any pointer and number serve.
    q_weight, q_eps = norms.q_norm if norms is not None else (q, 0.0)
    k_weight, k_eps = norms.k_norm if norms is not None else (q, 0.0)
    positions, inv_freq = (norms.positions, norms.inv_freq) if norms is not None else (q, q)
    _small_attention_kernel[(rows, heads)](
        q, k, v, cache, out, start, scale, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), cache.stride(0), cache.stride(1), cache.stride(2),
        cache.stride(3), out.stride(0), out.stride(1), out.stride(2), q_weight, k_weight, q_eps, k_eps, positions,
        inv_freq, NUM_NEW=num_new, GROUP=heads // kv_heads, HEAD_DIM=head_dim,
        MAX_LEN=triton.next_power_of_2(max_len), PROJECTED=norms is not None, num_warps=num_warps)
    return out


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


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel serves tensors of `dtype` on `device` (CUDA, and not refused by `check`)."""
    return triton is not None and device.type == "cuda" and (str(device), dtype) not in _refused


def check(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, max_len: int) -> bool:
    """Run the kernel once against the torch form on `device` (at load time, before any graph is captured); on an
    error or a mismatch, refuse it there (the torch form serves) and say so. Returns whether it serves."""
    return serves(device, dtype) and _verified(device, dtype, heads, kv_heads, head_dim, max_len)


def reference_heads(qkv: torch.Tensor, num_heads: int, head_dim: int,
                    norms: HeadNorms) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q and k [B, n, H, D] normed and rotated by the torch form (the layers' arithmetic), and v, from qkv [B, n,
    width]: what `small_attention_projected` reads, made the way the layer made it before."""
    from services.model.layers import Rope, apply_rope  # layers imports this module

    kv_width = (qkv.shape[-1] - num_heads * head_dim) // 2
    q, k, v = (part.view(*qkv.shape[:2], -1, head_dim)
               for part in qkv.split((num_heads * head_dim, kv_width, kv_width), dim=-1))
    cos, sin = Rope.tables_of(norms.positions, norms.inv_freq, qkv.dtype)

    def normed_rotated(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm
        wide = x.float()
        return apply_rope(weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), cos, sin)

    return normed_rotated(q, norms.q_norm), normed_rotated(k, norms.k_norm), v


def _verified(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
              max_len: int) -> bool:
    """Both kernel forms against the torch form on small random inputs; refused (and logged) on an error or a
    difference past the dtype's tolerance."""
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
            for got, cache in ((small_attention(plain, start, q, k, v, scale), plain),
                               (small_attention_projected(projected, start, step, heads, norms, scale), projected)):
                worst = max(worst, relative(got, want), relative(cache, torch_cache))
    except Exception:  # noqa: BLE001 - a kernel that cannot run here must not take the replica down
        log.exception("the fused code-predictor attention failed its start-up check on %s; the torch form serves",
                      device)
        _refused.add((str(device), dtype))
        return False
    # bfloat16: q and k rounded a step apart move the softmax by a few percent; a wrong kernel is off by its whole size
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    if worst > tolerance:
        log.warning("the fused code-predictor attention differs from the torch form by %.3g of its largest value on "
                    "%s (tolerance %g); the torch form serves", worst, device, tolerance)
        _refused.add((str(device), dtype))
        return False
    return True


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference over the largest value of `want`: the normed and rotated heads reach a few units, where
    bfloat16's rounding steps (which the kernel and torch's sin and cos take differently) are a few hundredths."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))
