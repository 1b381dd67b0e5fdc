"""CUDA graphs of the talker's decode step, at bucketed batch sizes and block-table widths.

An eager talker step issues ~2,000 kernels and is bound by their launches (loadtest/RESULTS-GPU.md); a
decode-only step has no host synchronisation (`services/model/paged_decode.py`), so it can be captured
once and replayed. A graph fixes every shape, so a step is padded up to a bucket:

- rows: powers of two up to `max_num_seqs` (and `max_num_seqs` itself). Padding rows are dummies: position
  0, length 1, every block column the reserved scratch block, so they write their K/V into the scratch
  block and read only it; their outputs are dropped. No real block is ever written by a dummy.
- block columns: powers of two up to the blocks of `max_model_len`; columns past the batch's own table
  point at the scratch block. Whatever a real row's columns past its last block hold, its length masks
  them (and their stale values are zeroed), so they are never read.

Each (rows, columns) bucket is captured on first use. All graphs share one memory pool: they never run
concurrently, and what a replay returns is consumed before the next step replays anything. Inputs live
in static buffers: a step's integer metadata is staged on the host (pinned) and copied into its bucket's
metadata tensor in one asynchronous transfer; the input rows are copied into the shared rows buffer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from services.engine import cuda_graph
from services.engine.config import EngineConfig
from services.engine.errors import EngineError
from services.model.attention_batch import AttentionBatch
from services.model import triton_decode
from services.model.paged_decode import is_decode_only, num_columns
from services.model.talker import Talker

log = logging.getLogger(__name__)

POSITION, SLOT, SEQ_LEN, TABLE = 0, 1, 2, 3
"""Columns of the staged metadata: position, slot, sequence length, then the block table."""


class DecodeBucketError(EngineError, ValueError):
    """A step given to `PaddedDecodeStep.run` is not decode-only or is larger than every bucket."""

    code = "no_decode_bucket"


@dataclass(frozen=True, slots=True)
class DecodeGraphSpec:
    """Which decode steps are graphed, and how."""

    max_num_seqs: int
    """The largest batch (rows bucket) captured; larger steps run eagerly."""
    max_blocks_per_seq: int
    """The widest block table captured; longer sequences run eagerly."""
    capture: bool = True
    """False: run the same padded, static-buffer step eagerly (how the CPU tests check padding and dummy rows)."""

    @classmethod
    def for_engine(cls, config: EngineConfig, device: torch.device) -> DecodeGraphSpec | None:
        """The engine's graphs: on CUDA when `config.cuda_graphs`, else None (eager steps)."""
        if device.type != "cuda" or not config.cuda_graphs:
            return None
        return cls(config.max_num_seqs, -(-config.max_model_len // config.block_size))


def buckets(limit: int) -> tuple[int, ...]:
    """Powers of two below `limit`, then `limit`: a step pads by less than 2x."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


def _bucket(value: int, sizes: tuple[int, ...]) -> int | None:
    return next((size for size in sizes if size >= value), None)


@dataclass(frozen=True, slots=True)
class _Bucket:
    """One (rows, columns) shape: its static metadata on the device and the step that reads it."""

    metadata: torch.Tensor
    """[rows, TABLE + columns] int64: position, slot, length, block table of every row."""
    step: Callable[[], torch.Tensor]
    """Runs the talker over the static buffers (a graph replay when captured); returns [rows, H]."""


class PaddedDecodeStep:
    """Decode-only talker steps over static, padded inputs; graph-replayed per bucket when `spec.capture`."""

    def __init__(self, talker: Talker, kv_pool: torch.Tensor, scratch_block: int, spec: DecodeGraphSpec) -> None:
        """`scratch_block`: a block of `kv_pool` no request ever owns (the dummies write there)."""
        self.talker, self.kv_pool, self.scratch_block, self.spec = talker, kv_pool, scratch_block, spec
        self.block_size = kv_pool.shape[3]
        device = kv_pool.device
        # The fused kernel walks each row's table up to the row's own length, so the table's width costs
        # nothing and one width serves every step; the torch kernel reads every column, so it is bucketed.
        fused = triton_decode.is_available(device)
        self.row_buckets = buckets(spec.max_num_seqs)
        self.column_buckets = (spec.max_blocks_per_seq,) if fused else buckets(spec.max_blocks_per_seq)
        self.rows = torch.zeros((spec.max_num_seqs, talker.hidden_size), dtype=kv_pool.dtype, device=device)
        self.query_start = torch.arange(spec.max_num_seqs + 1, dtype=torch.int64, device=device)
        self.graph_pool = torch.cuda.graph_pool_handle() if spec.capture else None
        self.prepared: dict[tuple[int, int], _Bucket] = {}
        self.num_capture_failures = 0
        """Buckets whose capture failed and that run eagerly instead (logged, and reported in the stats)."""

    def prepare_all(self) -> None:
        """Prepare (capture) every bucket now, so that no step after start-up pays for a capture."""
        for rows in self.row_buckets:
            for columns in self.column_buckets:
                if (rows, columns) not in self.prepared:
                    self._prepare(rows, columns)

    def bucket(self, batch: AttentionBatch) -> tuple[int, int] | None:
        """(rows, columns) of the bucket that runs `batch`, or None if it is not decode-only or too big."""
        if not is_decode_only(batch):
            return None
        rows = _bucket(batch.num_seqs, self.row_buckets)
        columns = _bucket(num_columns(batch, self.block_size), self.column_buckets)
        return None if rows is None or columns is None else (rows, columns)

    def run(self, rows: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Hidden states [B, H] of a decode-only step: input rows [B, H] on the device, `batch` on the host.

        The result is a view of a static buffer, valid until the next call.
        """
        key = self.bucket(batch)
        if key is None:
            raise DecodeBucketError(f"a batch of {batch.num_tokens} tokens in {batch.num_seqs} sequences fits no "
                                    "decode bucket; check `bucket(batch)` first and run such a step eagerly")
        bucket = self.prepared.get(key) or self._prepare(*key)
        bucket.metadata.copy_(self._staged(batch, *key), non_blocking=True)
        self.rows[: batch.num_seqs].copy_(rows)
        return bucket.step()[: batch.num_seqs]

    def _staged(self, batch: AttentionBatch | None, rows: int, columns: int) -> torch.Tensor:
        """A bucket's metadata on the host: dummy rows everywhere, then the batch's rows (None: dummies only).

        A fresh pinned tensor each step: torch's pinned-memory cache reuses it only once its asynchronous
        copy has completed, so no step waits for the device and none overwrites a copy still in flight.
        """
        host = torch.empty((rows, TABLE + columns), dtype=torch.int64, pin_memory=self.spec.capture)
        host[:, POSITION], host[:, SLOT], host[:, SEQ_LEN] = 0, self.scratch_block * self.block_size, 1
        host[:, TABLE:] = self.scratch_block
        if batch is not None:
            count, width = batch.num_seqs, min(int(batch.block_tables.shape[1]), columns)
            host[:count, POSITION], host[:count, SLOT] = batch.positions, batch.slot_mapping
            host[:count, SEQ_LEN] = batch.seq_lens
            host[:count, TABLE : TABLE + width] = batch.block_tables[:, :width]
        return host

    def _prepare(self, rows: int, columns: int) -> _Bucket:
        """The bucket's static inputs and step: the talker over them, captured as a CUDA graph when asked."""
        metadata = torch.zeros((rows, TABLE + columns), dtype=torch.int64, device=self.kv_pool.device)
        batch = AttentionBatch(
            positions=metadata[:, POSITION], slot_mapping=metadata[:, SLOT], query_start=self.query_start[: rows + 1],
            seq_lens=metadata[:, SEQ_LEN], block_tables=metadata[:, TABLE:], max_seq_len=columns * self.block_size,
        )
        inputs = self.rows[:rows]

        def forward() -> torch.Tensor:
            return self.talker(inputs, batch, self.kv_pool)

        step = forward
        if self.spec.capture:
            metadata.copy_(self._staged(None, rows, columns))  # warm-up and capture write only the scratch block
            try:
                step = self._capture(forward)
            except RuntimeError:
                # Same results eagerly, only slower: a capture problem must not take the replica down.
                log.exception("capturing the decode step for %d rows x %d block columns failed; it runs eagerly",
                              rows, columns)
                self.num_capture_failures += 1
        self.prepared[(rows, columns)] = bucket = _Bucket(metadata, step)
        return bucket

    def _capture(self, forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        return cuda_graph.capture(forward, self.kv_pool.device, self.graph_pool)
