"""The q and k heads of one attention layer normed and rotated in one Triton launch, read straight from the fused q/k/v
projection's output; on the talker the same launch writes k and v into the paged KV pool.

Before, a layer on CUDA spent two launches of `fused_norm_rope` (q, then k) and, on the talker, four more on the KV
write (each slot's block and offset, two index_puts): small launches that bound a graphed step's time. Here one
program serves one (token, head) pair, q heads first and then k heads (which follow the q heads in the projection's
row, so a head's columns are `head * head_dim` either way). In `store` mode a k-head program also copies its
kv head's v, so each token's K and V reach the pool in this launch and attention only reads the pool.

The arithmetic is `norm_rope_head`, which `fused_norm_rope` calls too (float32 statistics and angles, the same
roundings to the model dtype), so q and k equal its outputs bit for bit; the pool receives k and v converted to its
dtype as `paged_attention.write_kv` converts them. No host sync and no shape that depends on data: a CUDA graph can
capture the launch (the engine's padding tokens write wherever their slot points: its scratch block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.kernels.triton_support import tl, triton


@dataclass(frozen=True, slots=True)
class KvDestination:
    """Where `qk_norm_rope_into_pool` writes one layer's new K and V."""

    pool: torch.Tensor
    """The block-major pool [num_blocks, layers, 2, block_size, kv_heads, head_dim] (`attention_batch.py`)."""
    layer: int
    """The layer whose K and V these are."""
    slot_mapping: torch.Tensor
    """[T] int64: each token's flat slot `block * block_size + offset` (may be a strided column)."""


if triton is not None:

    @triton.jit
    def norm_rope_head(head_ptr, weight_ptr, eps, position, inv_freq_ptr, like_ptr, HEAD_DIM: tl.constexpr,
                       HALF: tl.constexpr):
        """One head (HEAD_DIM values from `head_ptr`) RMS-normed by `weight_ptr` and rotated to `position` (float32),
        in the dtype `like_ptr` points to: the torch form's steps (float32 statistics and angles, the same roundings
        to the model dtype). Every fused kernel that norms and rotates a head calls this one (`fused_norm_rope`, the
        launch below, the code predictor's one-launch attention), so they take the same steps: bit for bit under the
        interpreter; compiled, a kernel that inlines it may contract a multiply-add otherwise (~4e-7 in float32)."""
        dims = tl.arange(0, HEAD_DIM)
        partner = (dims + HALF) % HEAD_DIM  # rotate_half: d < HALF reads -x[d + HALF], the rest x[d - HALF]
        dtype = like_ptr.dtype.element_ty
        x = tl.load(head_ptr + dims).to(tl.float32)
        x_partner = tl.load(head_ptr + partner).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
        normed = (tl.load(weight_ptr + dims).to(tl.float32) * (x * scale).to(dtype).to(tl.float32)).to(dtype)
        partner_normed = (tl.load(weight_ptr + partner).to(tl.float32)
                          * (x_partner * scale).to(dtype).to(tl.float32)).to(dtype)
        rotated = tl.where(dims < HALF, -partner_normed.to(tl.float32), partner_normed.to(tl.float32))
        angle = position * tl.load(inv_freq_ptr + dims % HALF)
        cos = tl.cos(angle).to(dtype).to(tl.float32)
        sin = tl.sin(angle).to(dtype).to(tl.float32)
        return ((normed.to(tl.float32) * cos).to(dtype).to(tl.float32)
                + (rotated * sin).to(dtype).to(tl.float32)).to(dtype)

    @triton.jit
    def _qk_norm_rope_kernel(qkv_ptr, q_weight_ptr, k_weight_ptr, positions_ptr, inv_freq_ptr, q_out_ptr, k_out_ptr,
                             pool_ptr, slots_ptr, stride_token, stride_q_out, stride_k_out, stride_position,
                             num_positions, q_eps, k_eps, layer, stride_slot, stride_pool_block, stride_pool_layer,
                             stride_pool_kv, stride_pool_offset, stride_pool_head,
                             NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                             HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr, STORE: tl.constexpr):
        token = tl.program_id(0)
        head = tl.program_id(1)  # q heads, then k heads: either way its columns start at head * HEAD_DIM
        is_q = head < NUM_Q_HEADS
        if is_q:
            weight_ptr = q_weight_ptr
            eps = q_eps
        else:
            weight_ptr = k_weight_ptr
            eps = k_eps
        dims = tl.arange(0, HEAD_DIM)
        row = qkv_ptr + token * stride_token
        position = tl.load(positions_ptr + (token % num_positions) * stride_position).to(tl.float32)
        out = norm_rope_head(row + head * HEAD_DIM, weight_ptr, eps, position, inv_freq_ptr, q_out_ptr, HEAD_DIM,
                             HALF)
        if is_q:
            tl.store(q_out_ptr + token * stride_q_out + head * HEAD_DIM + dims, out)
        else:
            kv_head = head - NUM_Q_HEADS
            if STORE:
                slot = tl.load(slots_ptr + token * stride_slot).to(tl.int64)  # a pool can pass 2**31 elements
                at = (pool_ptr + (slot // BLOCK_SIZE) * stride_pool_block + layer * stride_pool_layer
                      + (slot % BLOCK_SIZE) * stride_pool_offset + kv_head * stride_pool_head + dims)
                pool_dtype = pool_ptr.dtype.element_ty
                value = tl.load(row + (NUM_Q_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM + dims)
                tl.store(at, out.to(pool_dtype))
                tl.store(at + stride_pool_kv, value.to(pool_dtype))
            else:
                tl.store(k_out_ptr + token * stride_k_out + kv_head * HEAD_DIM + dims, out)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The projection's output as [T, width] rows, and the head counts its width holds."""

    qkv: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor) -> _Rows:
        kv_width = qkv.shape[-1] - num_heads * head_dim
        if kv_width <= 0 or kv_width % (2 * head_dim):
            raise ValueError(f"a q/k/v row of width {qkv.shape[-1]} does not hold {num_heads} q heads of {head_dim} "
                             "and equal k and v parts")
        if head_dim & (head_dim - 1) or head_dim < 2:
            raise ValueError(f"the fused q/k norm + RoPE kernel needs a power-of-two head dim, got {head_dim}")
        if positions.dim() != 1 or qkv.dim() < 2 or qkv.shape[-2] != positions.shape[0]:
            raise ValueError(f"qk_norm_rope needs positions [P] for rows [..., P, width], got "
                             f"{tuple(positions.shape)} and {tuple(qkv.shape)}")
        rows = qkv.reshape(-1, qkv.shape[-1])
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        return cls(rows, num_heads, kv_width // (2 * head_dim), head_dim)


def qk_norm_rope(qkv: torch.Tensor, q_norm: tuple[torch.Tensor, float], k_norm: tuple[torch.Tensor, float],
                 positions: torch.Tensor, inv_freq: torch.Tensor, num_heads: int,
                 head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_rope` of q and of k in one launch: the projection's output qkv [..., P, q_width + 2 * kv_width] (heads
    dense, positions [P] repeated over the leading dimensions) -> new q [..., P, Hq, D] and k [..., P, Hkv, D].
    q_norm and k_norm are each (weight in qkv's dtype, eps)."""
    rows = _Rows.of(qkv, num_heads, head_dim, positions)
    q = torch.empty((rows.qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((rows.qkv.shape[0], rows.num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(rows, q_norm, k_norm, positions, inv_freq, q, k, None)
    return q.view(*qkv.shape[:-1], num_heads, head_dim), k.view(*qkv.shape[:-1], rows.num_kv_heads, head_dim)


def qk_norm_rope_into_pool(qkv: torch.Tensor, q_norm: tuple[torch.Tensor, float], k_norm: tuple[torch.Tensor, float],
                           positions: torch.Tensor, inv_freq: torch.Tensor, num_heads: int, head_dim: int,
                           destination: KvDestination) -> torch.Tensor:
    """`qk_norm_rope` for tokens qkv [T, width] whose k (normed, rotated) and v go to their slots of `destination`,
    as `paged_attention.write_kv` would store them; returns q [T, Hq, D]."""
    rows = _Rows.of(qkv, num_heads, head_dim, positions)
    pool = destination.pool
    if pool.dim() != 6 or pool.shape[4:] != (rows.num_kv_heads, head_dim) or pool.stride(5) != 1:
        raise ValueError(f"a pool [blocks, layers, 2, block_size, {rows.num_kv_heads}, {head_dim}] with dense heads "
                         f"is needed, got {tuple(pool.shape)}")
    if destination.slot_mapping.shape != (rows.qkv.shape[0],):
        raise ValueError(f"one slot per token is needed, got {tuple(destination.slot_mapping.shape)} for "
                         f"{rows.qkv.shape[0]} tokens")
    q = torch.empty((rows.qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(rows, q_norm, k_norm, positions, inv_freq, q, q, destination)
    return q.view(*qkv.shape[:-1], num_heads, head_dim)


def _launch(rows: _Rows, q_norm: tuple[torch.Tensor, float], k_norm: tuple[torch.Tensor, float],
            positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
            destination: KvDestination | None) -> None:
    """One launch over (tokens, q heads + kv heads); without a destination the unused pool arguments point at q."""
    (q_weight, q_eps), (k_weight, k_eps) = q_norm, k_norm
    if q_weight.dtype != rows.qkv.dtype or k_weight.dtype != rows.qkv.dtype:
        raise ValueError(f"qk_norm_rope needs the norm weights in the input's dtype {rows.qkv.dtype}, got "
                         f"{q_weight.dtype} and {k_weight.dtype}")
    pool, slots, layer = (q, q, 0) if destination is None else (
        destination.pool, destination.slot_mapping, destination.layer)
    pool_strides = pool.stride()[:5] if destination is not None else (0,) * 5
    _qk_norm_rope_kernel[(rows.qkv.shape[0], rows.num_heads + rows.num_kv_heads)](
        rows.qkv, q_weight, k_weight, positions, inv_freq, q, k, pool, slots,
        rows.qkv.stride(0), q.stride(0), k.stride(0), positions.stride(0), positions.shape[0], q_eps, k_eps, layer,
        slots.stride(0), *pool_strides,
        NUM_Q_HEADS=rows.num_heads, NUM_KV_HEADS=rows.num_kv_heads, HEAD_DIM=rows.head_dim, HALF=rows.head_dim // 2,
        BLOCK_SIZE=pool.shape[3] if destination is not None else 1, STORE=destination is not None)
