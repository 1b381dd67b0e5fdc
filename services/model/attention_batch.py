"""The contract between the engine (which owns the paged KV pool) and the talker (which reads it).

The KV pool is block-major: `pool[block]` holds every layer's K and V for `block_size`
tokens in one contiguous region, so a block moves between GPUs as one transfer:

    pool.shape == (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)

A batch is flattened: the new tokens of all sequences are concatenated (prefill rows
contribute many tokens, decode rows one). Sequence i owns tokens
`query_start[i]:query_start[i+1]` of the flattened batch; every sequence adds at least one token,
so a batch with as many tokens as sequences is decode-only (one new token each), which attention
can tell from the shapes alone, without reading a tensor on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Where each token of a flattened batch sits and which KV slots it writes and reads."""

    positions: torch.Tensor
    """[T] int64: the absolute (RoPE) position of each new token."""
    slot_mapping: torch.Tensor
    """[T] int64: flat slot `block * block_size + offset` where the token's K/V are written."""
    query_start: torch.Tensor
    """[B+1] int64: cumulative count of new tokens; sequence i owns [query_start[i], query_start[i+1])."""
    seq_lens: torch.Tensor
    """[B] int64: tokens of each sequence in the cache after this step (old + new)."""
    block_tables: torch.Tensor
    """[B, max_blocks] int64: the pool blocks of each sequence in order; entries past a sequence's
    last block are padding and never read."""
    max_seq_len: int | None = None
    """Host-side: the largest of `seq_lens`, when the builder knows it (the engine does). Attention then
    sizes its padding from this number instead of reading `seq_lens` back from the device (a host sync);
    any value >= every sequence's length is correct. None: attention works it out (decode-only batches
    use the block table's width, which is also known without a sync)."""
    token_rows: torch.Tensor | None = None
    """[T] int64, the per-token form (set by the engine's padded steps): the `block_tables` row token t reads.
    With it, attention needs no per-sequence sizes at all: token t attends to the first `token_limits[t]`
    cache entries of its row, so prefill chunks and decode rows run through one shape-static kernel."""
    token_limits: torch.Tensor | None = None
    """[T] int64, with `token_rows`: cache entries token t may see (its position + 1: causal, itself included)."""

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def kv_pool_shape(num_blocks: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """The block-major pool layout every component agrees on."""
    return (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)
