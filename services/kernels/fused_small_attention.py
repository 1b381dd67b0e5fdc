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

The torch form and the start-up check that compares the two on the model's device are the model's
(`services/model/small_attention.py`); the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.kernels.triton_support import tl, triton

NUM_WARPS = 1
"""Warps per program (one row and query head: a [16, head_dim] tile)."""


if triton is not None:
    from services.kernels.fused_qk_norm_rope import norm_rope_head

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
