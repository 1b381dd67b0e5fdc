"""Attention over the engine's block-major paged KV pool (layout in `attention_batch.py`).

`PagedAttention` is the `Attend` the talker uses: for each layer it writes the new tokens' K and V to their
slots, then attends every new token to its sequence's cached tokens, causally. Two kernels, both plain torch
and correct on every device; `select_kernel` picks one by the batch's shape:
- `REFERENCE` serves any batch (prefill, chunked prefill, mixed); it reads sizes back from the device;
- `DECODE` (`paged_decode.py`) serves decode-only batches with no host synchronisation, so a decode step
  can be captured in a CUDA graph; it is tested equal to the reference.
What does not depend on the layer (padding, masks, block columns, each slot's block and offset) is worked out
once per forward. Where the attention kernel is Triton (`FUSED_DECODE`, `TOKEN` on CUDA), the layer's fused
q/k norm + RoPE kernel writes K and V itself (`kv_destination`, `attend_stored`): no separate write at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import torch
from torch.nn import functional as F

from services.model.attention_batch import AttentionBatch
from services.kernels import triton_decode
from services.kernels.fused_qk_norm_rope import KvDestination
from services.model.paged_decode import DecodeLayout, decode_kernel, is_decode_only
from services.kernels.triton_support import compiles_for


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """The batch padded to [B, max_q] queries and [B, S] cached tokens (S a whole number of blocks)."""

    query_index: torch.Tensor
    """[B, max_q] int64: the flat token each padded query row reads (clamped for padding rows)."""
    query_valid: torch.Tensor
    """[B, max_q] bool: the rows that are real tokens."""
    tables: torch.Tensor
    """[B, S / block_size] int64: the block columns that hold any sequence's tokens."""
    visible: torch.Tensor
    """[B, 1, max_q, S] bool: query row q of sequence b may attend cache index s (causal, within length)."""
    stale: torch.Tensor
    """[B, 1, S, 1] bool: cache indices past a sequence's length (never trusted, see `reference_kernel`)."""

    @classmethod
    def of(cls, batch: AttentionBatch, block_size: int) -> PagedLayout:
        device = batch.seq_lens.device
        num_queries = batch.query_start[1:] - batch.query_start[:-1]
        max_q = int(num_queries.max())
        num_blocks = -(-int(batch.seq_lens.max()) // block_size)
        steps = torch.arange(max_q, device=device)
        query_index = (batch.query_start[:-1, None] + steps[None, :]).clamp(max=batch.num_tokens - 1)
        # New token j of sequence i sits at cache index seq_len - num_queries + j and sees indices up to it.
        last_visible = (batch.seq_lens - num_queries)[:, None] + steps[None, :]
        keys = torch.arange(num_blocks * block_size, device=device)
        return cls(
            query_index=query_index,
            query_valid=steps[None, :] < num_queries[:, None],
            tables=batch.block_tables[:, :num_blocks],
            visible=(keys[None, None, :] <= last_visible[:, :, None])[:, None],
            stale=(keys[None, :] >= batch.seq_lens[:, None])[:, None, :, None],
        )



@dataclass(frozen=True, slots=True)
class PoolSlots:
    """Each new token's flat slot `block * block_size + offset` split into its block and offset (two launches, paid
    once per forward rather than in every layer)."""

    blocks: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def of(cls, slot_mapping: torch.Tensor, block_size: int) -> PoolSlots:
        return cls(slot_mapping // block_size, slot_mapping % block_size)


def write_kv(pool: torch.Tensor, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store k and v [T, Hkv, D] of one layer at their flat slots `block * block_size + offset`."""
    write_kv_at(pool, layer, PoolSlots.of(slot_mapping, pool.shape[3]), k, v)


def write_kv_at(pool: torch.Tensor, layer: int, slots: PoolSlots, k: torch.Tensor, v: torch.Tensor) -> None:
    """`write_kv` with the slots already split."""
    pool[slots.blocks, layer, 0, slots.offsets] = k.to(pool.dtype)
    pool[slots.blocks, layer, 1, slots.offsets] = v.to(pool.dtype)


def reference_kernel(q: torch.Tensor, pool: torch.Tensor, layer: int, layout: PagedLayout, scale: float) -> torch.Tensor:
    """Causal attention of every new token to its sequence's cache (which already holds the new tokens)."""
    rows, columns = layout.tables.shape
    kv = pool[layout.tables, layer]  # [B, nb, 2, bs, Hkv, D]
    kv = kv.transpose(2, 3).reshape(rows, columns * pool.shape[3], 2, *pool.shape[-2:]).permute(0, 2, 3, 1, 4)
    # Slots past a sequence's length hold whatever an earlier owner left (NaN included): a masked score
    # still multiplies its value, so those slots are zeroed rather than trusted.
    k, v = (kv[:, 0].masked_fill(layout.stale, 0).to(q.dtype), kv[:, 1].masked_fill(layout.stale, 0).to(q.dtype))
    out = F.scaled_dot_product_attention(
        q[layout.query_index].transpose(1, 2), k, v, attn_mask=layout.visible, scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out.transpose(1, 2)[layout.query_valid]


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """An attention kernel over the paged pool and the per-forward layout it reads."""

    name: str
    plan: Callable[[AttentionBatch, int, torch.dtype], object]
    """(batch, block_size, pool dtype) -> the layout, built once per forward."""
    attend: Callable[[torch.Tensor, torch.Tensor, int, object, float], torch.Tensor]
    """(q [T, Hq, D], pool, layer, layout, scale) -> [T, Hq, D], the new tokens' K/V already in the pool."""
    is_triton: Callable[[torch.device], bool] = lambda _device: False
    """Whether it runs Triton for a pool on that device: then the fused q/k norm + RoPE kernel, Triton too, may write
    the new tokens' K/V (`PagedAttention.kv_destination`); the torch kernels keep `write_kv`, which runs anywhere."""


REFERENCE = AttentionKernel("reference", lambda batch, block_size, _dtype: PagedLayout.of(batch, block_size),
                            reference_kernel)
DECODE = AttentionKernel("decode", DecodeLayout.of, decode_kernel)


def _token_plan(batch: AttentionBatch, block_size: int, dtype: torch.dtype) -> AttentionBatch | DecodeLayout:
    if compiles_for(batch.token_limits.device):
        return batch  # the fused kernel reads the table rows and limits as they are
    # The torch form: each token is a one-token "sequence" with its own copy of its row's table.
    per_token = replace(batch, block_tables=batch.block_tables[batch.token_rows], seq_lens=batch.token_limits,
                        max_seq_len=None)
    return DecodeLayout.of(per_token, block_size, dtype)


def _token_attend(q: torch.Tensor, pool: torch.Tensor, layer: int, plan: AttentionBatch | DecodeLayout,
                  scale: float) -> torch.Tensor:
    if isinstance(plan, DecodeLayout):
        return decode_kernel(q, pool, layer, plan, scale)
    return triton_decode.decode_attention(q, pool, layer, plan.block_tables, plan.token_limits, scale,
                                          token_rows=plan.token_rows)


def _fused_plan(batch: AttentionBatch, _block_size: int, _dtype: torch.dtype) -> AttentionBatch:
    return batch  # the kernel reads the block table and lengths as they are: nothing to prepare


def _fused_attend(q: torch.Tensor, pool: torch.Tensor, layer: int, batch: AttentionBatch, scale: float) -> torch.Tensor:
    return triton_decode.decode_attention(q, pool, layer, batch.block_tables, batch.seq_lens, scale)


FUSED_DECODE = AttentionKernel("fused_decode", _fused_plan, _fused_attend, lambda _device: True)
"""The Triton kernel (`triton_decode.py`) on a decode-only batch: reads each row's blocks in place."""
TOKEN = AttentionKernel("token", _token_plan, _token_attend, compiles_for)
"""Per-token form (`AttentionBatch.token_rows`): any mix of prefill and decode tokens, no host sync; the Triton
kernel where it runs, else the torch decode kernel over per-token tables (the CPU tests' path)."""


def select_kernel(batch: AttentionBatch) -> AttentionKernel:
    """`TOKEN` for a batch in the per-token form; for a decode-only batch (decided from shapes, no sync)
    `FUSED_DECODE` where Triton runs on the batch's device, else `DECODE`; any other batch `REFERENCE`."""
    if batch.token_rows is not None:
        return TOKEN
    if not is_decode_only(batch):
        return REFERENCE
    return FUSED_DECODE if compiles_for(batch.seq_lens.device) else DECODE


class PagedAttention:
    """The talker's `Attend` for one forward pass over a flattened batch (an `AttendsFromPool`: see `layers.py`)."""

    def __init__(self, pool: torch.Tensor, batch: AttentionBatch, scale: float,
                 kernel: AttentionKernel | None = None) -> None:
        """`kernel` forces one kernel (benchmarks, equality tests); None selects by the batch's shape."""
        self.pool, self.slot_mapping, self.scale = pool, batch.slot_mapping, scale
        self.kernel = kernel or select_kernel(batch)
        self.layout = self.kernel.plan(batch, pool.shape[3], pool.dtype)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        write_kv_at(self.pool, layer, self._slots, k, v)
        return self.attend_stored(layer, q)

    def kv_destination(self, layer: int) -> KvDestination | None:
        """The pool slots of this layer's new K/V where the attention kernel is Triton, for the fused q/k norm + RoPE
        kernel to write; None where it is torch (then `__call__` writes them)."""
        if not self.kernel.is_triton(self.pool.device):
            return None
        return KvDestination(self.pool, layer, self.slot_mapping)

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of q [T, Hq, D] once this layer's new K/V are in the pool."""
        return self.kernel.attend(q, self.pool, layer, self.layout, self.scale)

    @cached_property
    def _slots(self) -> PoolSlots:
        # On first use, so a forward whose every layer writes through the fused kernel never pays for it.
        return PoolSlots.of(self.slot_mapping, self.pool.shape[3])
