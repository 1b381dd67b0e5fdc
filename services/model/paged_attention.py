"""Attention over the engine's block-major paged KV pool (layout in `attention_batch.py`).

`PagedAttention` is the `Attend` the talker uses: for each layer it writes the new tokens' K and V to their
slots, then attends every new token to its sequence's cached tokens, causally. The implementation here is
plain torch and correct on every device; `select_kernel` is where a device-specific fast path (a fused CUDA
decode kernel, say) takes over once it exists and is proven equal to this one.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn import functional as F

from services.model.attention_batch import AttentionBatch

# (q [T, Hq, D], pool, layer, batch, scale) -> [T, Hq, D]
AttentionKernel = Callable[[torch.Tensor, torch.Tensor, int, AttentionBatch, float], torch.Tensor]


def write_kv(pool: torch.Tensor, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store k and v [T, Hkv, D] of one layer at their flat slots `block * block_size + offset`."""
    block_size = pool.shape[3]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    pool[blocks, layer, 0, offsets] = k.to(pool.dtype)
    pool[blocks, layer, 1, offsets] = v.to(pool.dtype)


def _padded_queries(q: torch.Tensor, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, H, D] -> [B, max_q, H, D], the valid-row mask [B, max_q] and each sequence's query count [B]."""
    num_queries = batch.query_start[1:] - batch.query_start[:-1]
    max_q = int(num_queries.max())
    steps = torch.arange(max_q, device=q.device)
    valid = steps[None, :] < num_queries[:, None]
    index = (batch.query_start[:-1, None] + steps[None, :]).clamp(max=q.shape[0] - 1)
    return q[index], valid, num_queries


def _gathered_kv(pool: torch.Tensor, layer: int, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's cached K and V, [B, Hkv, S, D] with S a whole number of blocks."""
    block_size = pool.shape[3]
    num_blocks = -(-int(batch.seq_lens.max()) // block_size)
    tables = batch.block_tables[:, :num_blocks]
    kv = pool[tables, layer]  # [B, nb, 2, bs, Hkv, D]
    kv = kv.transpose(2, 3).reshape(tables.shape[0], num_blocks * block_size, 2, *pool.shape[-2:])
    return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def reference_kernel(q: torch.Tensor, pool: torch.Tensor, layer: int, batch: AttentionBatch, scale: float) -> torch.Tensor:
    """Causal attention of every new token to its sequence's cache (which already holds the new tokens)."""
    q_pad, valid, num_queries = _padded_queries(q, batch)
    k, v = _gathered_kv(pool, layer, batch)
    # New token j of sequence i sits at cache index seq_len - num_queries + j and sees indices up to it.
    last_visible = (batch.seq_lens - num_queries)[:, None] + torch.arange(q_pad.shape[1], device=q.device)[None, :]
    keys = torch.arange(k.shape[2], device=q.device)
    mask = keys[None, None, :] <= last_visible[:, :, None]
    # Slots past a sequence's length hold whatever an earlier owner left (NaN included): a masked score
    # still multiplies its value, so those slots are zeroed rather than trusted.
    stale = (keys[None, :] >= batch.seq_lens[:, None])[:, None, :, None]
    k, v = k.masked_fill(stale, 0), v.masked_fill(stale, 0)
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2), k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None], scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out.transpose(1, 2)[valid]


def select_kernel(device: torch.device) -> AttentionKernel:
    """The attention kernel for a device. Only the reference kernel exists today."""
    return reference_kernel


class PagedAttention:
    """The talker's `Attend` for one forward pass over a flattened batch."""

    def __init__(self, pool: torch.Tensor, batch: AttentionBatch, scale: float) -> None:
        self.pool, self.batch, self.scale = pool, batch, scale
        self.kernel = select_kernel(pool.device)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        write_kv(self.pool, layer, self.batch.slot_mapping, k, v)
        return self.kernel(q, self.pool, layer, self.batch, self.scale)
