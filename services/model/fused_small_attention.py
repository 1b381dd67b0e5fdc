"""The code predictor's attention as one Triton kernel on CUDA: write the new keys and values into the dense cache
and attend over at most 16 cached tokens, in one launch per layer and step.

The torch form is two cache writes (strided copies), the attention (a few launches) and a copy of its transposed
output, five or more launches in each of the 5 layers of each of the 15 steps of a frame: a quarter of the frame's
launches for a few kilobytes of work. One program per (row, query head) reads its kv head's cached keys and values
(positions before `start`) and the new ones straight from the inputs (so no program reads what another writes in
the same launch), applies the causal mask, softmax in float32, and writes its output rows, laid out as the layer
reads them; the first program of each kv head group stores the new keys and values in the cache for later steps.

Off CUDA the torch form serves; the CPU tests check this kernel under Triton's interpreter. Where it runs, the loader
checks it once against the torch form on the model's device (`check`) and falls back to the torch form, saying so,
should it fail there.
"""

from __future__ import annotations

import logging

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

    @triton.jit
    def _small_attention_kernel(q_ptr, k_ptr, v_ptr, cache_ptr, out_ptr, start, scale,
                                stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                                stride_vb, stride_vn, stride_vh, stride_cache_kv, stride_cache_b, stride_cache_h,
                                stride_cache_s, stride_ob, stride_on, stride_oh,
                                NUM_NEW: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                MAX_LEN: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        dims = tl.arange(0, HEAD_DIM)
        positions = tl.arange(0, MAX_LEN)
        dtype = out_ptr.dtype.element_ty
        is_cached = positions < start
        is_new = (positions >= start) & (positions < start + NUM_NEW)
        new_index = tl.where(is_new, positions - start, 0)
        cache_keys = cache_ptr + row * stride_cache_b + kv_head * stride_cache_h
        cache_at = positions[:, None] * stride_cache_s + dims[None, :]
        keys = tl.load(cache_keys + cache_at, mask=is_cached[:, None], other=0.0)
        values = tl.load(cache_keys + stride_cache_kv + cache_at, mask=is_cached[:, None], other=0.0)
        new_keys = tl.load(k_ptr + row * stride_kb + kv_head * stride_kh + new_index[:, None] * stride_kn
                           + dims[None, :], mask=is_new[:, None], other=0.0)
        new_values = tl.load(v_ptr + row * stride_vb + kv_head * stride_vh + new_index[:, None] * stride_vn
                             + dims[None, :], mask=is_new[:, None], other=0.0)
        keys = tl.where(is_new[:, None], new_keys, keys).to(tl.float32)
        values = tl.where(is_new[:, None], new_values, values).to(tl.float32)
        for token in tl.static_range(NUM_NEW):
            query = tl.load(q_ptr + row * stride_qb + token * stride_qn + head * stride_qh + dims).to(tl.float32)
            scores = tl.sum(keys * query[None, :], axis=1) * scale
            scores = tl.where(positions <= start + token, scores, float("-inf"))  # causal, within the tokens so far
            weights = tl.exp(scores - tl.max(scores, axis=0))
            weights = weights / tl.sum(weights, axis=0)
            out = tl.sum(weights[:, None] * values, axis=0)
            tl.store(out_ptr + row * stride_ob + token * stride_on + head * stride_oh + dims, out.to(dtype))
        writes = is_new & (head % GROUP == 0)  # one program per kv head stores the new entries, for later steps
        tl.store(cache_keys + cache_at, new_keys, mask=writes[:, None])
        tl.store(cache_keys + stride_cache_kv + cache_at, new_values, mask=writes[:, None])


def small_attention(cache: torch.Tensor, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """Attention of q [B, n, Hq, D] over the first `start` entries of `cache` [2, B, Hkv, S, D] (one layer's keys and
    values) and the n new ones k, v [B, n, Hkv, D], causally; stores k, v at positions start..start+n of the cache.
    Returns [B, n, Hq, D] (contiguous)."""
    rows, num_new, heads, head_dim = q.shape
    kv_heads, max_len = cache.shape[2], cache.shape[3]
    if start + num_new > max_len or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"small_attention needs start + n <= {max_len} and dense heads, got start {start}, "
                         f"q {tuple(q.shape)}")
    out = torch.empty((rows, num_new, heads, head_dim), dtype=q.dtype, device=q.device)
    _small_attention_kernel[(rows, heads)](
        q, k, v, cache, out, start, scale, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), cache.stride(0), cache.stride(1), cache.stride(2),
        cache.stride(3), out.stride(0), out.stride(1), out.stride(2),
        NUM_NEW=num_new, GROUP=heads // kv_heads, HEAD_DIM=head_dim, MAX_LEN=triton.next_power_of_2(max_len),
        num_warps=num_warps)
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


def _verified(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
              max_len: int) -> bool:
    """`small_attention` against the torch form on small random inputs; refused (and logged) on an error or a
    difference past the dtype's tolerance."""
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (3, 2, heads, head_dim)
    q, k, v = (torch.randn(shape if n == 0 else (3, 2, kv_heads, head_dim), generator=generator, device=device)
               .to(dtype) for n in range(3))
    worst = 0.0
    try:
        fused_cache = torch.zeros((2, 3, kv_heads, max_len, head_dim), dtype=dtype, device=device)
        plain_cache = fused_cache.clone()
        # The steps the code predictor runs: two tokens at position 0, then one that reads them from the cache. (A
        # later step of two tokens is no case of it: the torch form is not causal there, the kernel is.)
        for start, num_new in ((0, 2), (2, 1)):
            step = (q[:, :num_new], k[:, :num_new], v[:, :num_new])
            got = small_attention(fused_cache, start, *step, head_dim**-0.5)
            want = torch_form(plain_cache, start, *step, head_dim**-0.5)
            worst = max(worst, float((got.float() - want.float()).abs().max()))
            worst = max(worst, float((fused_cache - plain_cache).float().abs().max()))
    except Exception:  # noqa: BLE001 - a kernel that cannot run here must not take the replica down
        log.exception("the fused code-predictor attention failed its start-up check on %s; the torch form serves",
                      device)
        _refused.add((str(device), dtype))
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    if worst > tolerance:
        log.warning("the fused code-predictor attention differs from the torch form by %.3g on %s (tolerance %g); "
                    "the torch form serves", worst, device, tolerance)
        _refused.add((str(device), dtype))
        return False
    return True
