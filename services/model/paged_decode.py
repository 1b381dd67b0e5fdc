"""Decode-only attention over the block-major paged pool: one new token per sequence, no host sync.

The reference kernel (`paged_attention.py`) serves any batch but reads tensor values on the host (the
longest query and sequence, boolean-mask row selection), so a forward that uses it cannot be captured
in a CUDA graph and stalls the launch queue every layer. In a decode step every sequence adds exactly
one token, and then every size this kernel needs is a shape or a host-side number:

- the padded length is the block table's width (or `AttentionBatch.max_seq_len`, rounded up to
  whole blocks), so a graph runner that fixes the table's width fixes every shape;
- the new token of sequence b is row b of the flattened batch: no row selection at all;
- query heads are grouped under their K/V head as the query axis of SDPA ([B, Hkv, G, D] against
  [B, Hkv, L, D]), which is grouped-query attention without repeating K/V and without relying on a
  backend's `enable_gqa` support.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from services.model.attention_batch import AttentionBatch


def is_decode_only(batch: AttentionBatch) -> bool:
    """Whether every sequence adds exactly one token (shapes only: each sequence adds at least one)."""
    return batch.num_tokens == batch.num_seqs


def num_columns(batch: AttentionBatch, block_size: int) -> int:
    """Block columns attention reads per sequence: the table's width, trimmed by `max_seq_len` if known."""
    width = int(batch.block_tables.shape[1])
    if batch.max_seq_len is None:
        return width
    return max(1, min(width, -(-batch.max_seq_len // block_size)))


@dataclass(frozen=True, slots=True)
class DecodeLayout:
    """What does not depend on the layer: the block columns, the stale slots and the score bias."""

    tables: torch.Tensor
    """[B, C] int64: the block columns each sequence reads (entries past its last block are masked)."""
    stale: torch.Tensor
    """[B, L, 1, 1] bool, L = C * block_size: cache indices at or past the sequence's length."""
    bias: torch.Tensor
    """[B, 1, 1, L]: 0 where a key is visible, -inf where stale (added to the scores by SDPA)."""

    @classmethod
    def of(cls, batch: AttentionBatch, block_size: int, dtype: torch.dtype) -> DecodeLayout:
        """The layout of a decode-only batch; the bias is made in `dtype` (the pool's, which is the model's)."""
        columns = num_columns(batch, block_size)
        keys = torch.arange(columns * block_size, device=batch.seq_lens.device)
        stale = keys[None, :] >= batch.seq_lens[:, None]
        bias = torch.zeros(stale.shape, dtype=dtype, device=stale.device).masked_fill_(stale, float("-inf"))
        return cls(tables=batch.block_tables[:, :columns], stale=stale[:, :, None, None], bias=bias[:, None, None, :])


def _gather(pool: torch.Tensor, layer: int, which: int, layout: DecodeLayout, dtype: torch.dtype) -> torch.Tensor:
    """K (which=0) or V (which=1) of every sequence's columns as [B, Hkv, L, D], stale slots zeroed."""
    rows, columns = layout.tables.shape
    block_size, kv_heads, head_dim = pool.shape[3:]
    # Advanced indexing copies, so the in-place zeroing below never touches the pool.
    cache = pool[layout.tables, layer, which].view(rows, columns * block_size, kv_heads, head_dim)
    # Stale slots hold whatever an earlier owner left (NaN included): a masked score still multiplies
    # its value, and a NaN key makes its score NaN before the mask is added, so both are zeroed.
    cache.masked_fill_(layout.stale, 0)
    return cache.to(dtype).transpose(1, 2)


def decode_kernel(q: torch.Tensor, pool: torch.Tensor, layer: int, layout: DecodeLayout, scale: float) -> torch.Tensor:
    """Attention of each sequence's one new token (q [B, Hq, D]) to its cache, which already holds it."""
    rows, num_heads, head_dim = q.shape
    keys = _gather(pool, layer, 0, layout, q.dtype)
    values = _gather(pool, layer, 1, layout, q.dtype)
    kv_heads = keys.shape[1]
    # Query head h reads K/V head h // G (as enable_gqa does), so the G heads of a group are G queries.
    queries = q.reshape(rows, kv_heads, num_heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=layout.bias.to(q.dtype), scale=scale)
    return out.reshape(rows, num_heads, head_dim)
