"""CUDA graphs of the talker's step, at bucketed token counts: decode rows and prefill chunks in one replay.

An eager talker step issues thousands of kernels and is bound by their launches. In the
per-token form of attention (`AttentionBatch.token_rows`) every size is a tensor shape: token t attends to the
first `token_limits[t]` cache entries of block-table row `token_rows[t]`, with no host synchronisation. So a
step of any mix (decode rows, prefill chunks, replays) is captured once per token bucket and replayed; a
prefill chunk never pushes the decoding rows off the graph. A step is padded up to its bucket:

- tokens: powers of two up to the step's token budget (`max_num_batched_tokens`). Padding tokens are dummies:
  position 0, their K/V written into the reserved scratch block, reading only the scratch row of the table
  (every column the scratch block), one cache entry; their outputs are dropped. No real block is ever written.
- the block table: one static [max_num_seqs + 1, max_blocks_per_seq] tensor (the last row is the scratch row).
  A step copies its rows in; columns past what a token may see are never read, whatever they hold.

All graphs share one memory pool: they never run concurrently, and what a replay returns is consumed before the
next step replays anything. A step's integer metadata is staged on the host (pinned) and copied in with two
asynchronous transfers; the input rows are copied into the shared rows buffer. Every bucket is captured at
start-up (`prepare_all`); a capture that fails leaves that bucket eager, logged and counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from services.model import cuda_graph
from services.engine.config import EngineConfig
from services.engine.errors import EngineError
from services.model.attention_batch import AttentionBatch
from services.model.talker import Talker

log = logging.getLogger(__name__)

POSITION, SLOT, ROW, LIMIT = 0, 1, 2, 3
"""Columns of a step's staged token metadata."""


class TalkerBucketError(EngineError, ValueError):
    """A step given to `PaddedTalkerStep.run` is larger than every bucket (tokens, sequences or table width)."""

    code = "no_talker_bucket"


@dataclass(frozen=True, slots=True)
class TalkerGraphSpec:
    """Which talker steps are graphed, and how."""

    max_num_seqs: int
    """The most sequences in one step (rows of the static block table)."""
    max_blocks_per_seq: int
    """The widest block table; longer sequences run eagerly."""
    max_num_tokens: int
    """The largest token bucket (the step's token budget); larger steps run eagerly."""
    capture: bool = True
    """False: run the same padded, static-buffer step eagerly (how the CPU tests check padding and dummy tokens)."""

    @classmethod
    def for_engine(cls, config: EngineConfig, device: torch.device) -> TalkerGraphSpec | None:
        """The engine's graphs: on CUDA when `config.cuda_graphs`, else None (eager steps)."""
        if device.type != "cuda" or not config.cuda_graphs:
            return None
        return cls(config.max_num_seqs, -(-config.max_model_len // config.block_size), config.max_num_batched_tokens)


def buckets(limit: int) -> tuple[int, ...]:
    """Powers of two below `limit`, then `limit`: a step pads by less than 2x."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


@dataclass(frozen=True, slots=True)
class _Bucket:
    """One token count: its static metadata on the device and the step that reads it."""

    metadata: torch.Tensor
    """[tokens, 4] int64: position, slot, table row and visible cache entries of every token."""
    step: Callable[[], torch.Tensor]
    """Runs the talker over the static buffers (a graph replay when captured); returns [tokens, H]."""


class PaddedTalkerStep:
    """Talker steps over static, padded inputs in the per-token form; graph-replayed per bucket when `spec.capture`."""

    def __init__(self, talker: Talker, kv_pool: torch.Tensor, scratch_block: int, spec: TalkerGraphSpec) -> None:
        """`scratch_block`: a block of `kv_pool` no request ever owns (the dummies write there)."""
        self.talker, self.kv_pool, self.scratch_block, self.spec = talker, kv_pool, scratch_block, spec
        self.block_size = kv_pool.shape[3]
        self.token_buckets = buckets(spec.max_num_tokens)
        device = kv_pool.device
        self.rows = torch.zeros((spec.max_num_tokens, talker.hidden_size), dtype=kv_pool.dtype, device=device)
        self.scratch_row = spec.max_num_seqs
        self.tables = torch.full((spec.max_num_seqs + 1, spec.max_blocks_per_seq), scratch_block, dtype=torch.int64,
                                 device=device)
        self.query_start = torch.arange(spec.max_num_tokens + 1, dtype=torch.int64, device=device)
        self.graph_pool = torch.cuda.graph_pool_handle() if spec.capture else None
        self.prepared: dict[int, _Bucket] = {}
        self.num_capture_failures = 0
        """Buckets whose capture failed and that run eagerly instead (logged, and reported in the stats)."""

    def prepare_all(self) -> None:
        """Prepare (capture) every bucket now, so that no step after start-up pays for a capture."""
        for tokens in self.token_buckets:
            if tokens not in self.prepared:
                self._prepare(tokens)

    def bucket_of(self, num_tokens: int) -> int | None:
        """The token bucket of a step of `num_tokens` tokens (None: larger than every bucket)."""
        return next((size for size in self.token_buckets if size >= num_tokens), None)

    def bucket(self, batch: AttentionBatch) -> int | None:
        """The token bucket that runs `batch`, or None if it has too many tokens, sequences or block columns."""
        if batch.num_seqs > self.spec.max_num_seqs or int(batch.block_tables.shape[1]) > self.spec.max_blocks_per_seq:
            return None
        return self.bucket_of(batch.num_tokens)

    def input_rows(self, batch: AttentionBatch) -> torch.Tensor | None:
        """Where `run` reads a step's input rows ([T, H], a view of the static buffer; None when no bucket holds
        the step): rows built there need no copy."""
        return None if self.bucket(batch) is None else self.rows[: batch.num_tokens]

    def run(self, rows: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Hidden states [T, H] of a step: input rows [T, H] on the device (`input_rows(batch)` itself, or any
        tensor, copied in), `batch` with host tensors.

        The result is a view of a static buffer, valid until the next call.
        """
        tokens = self.bucket(batch)
        if tokens is None:
            raise TalkerBucketError(f"a step of {batch.num_tokens} tokens in {batch.num_seqs} sequences fits no "
                                    "talker bucket; check `bucket(batch)` first and run such a step eagerly")
        bucket = self.prepared.get(tokens) or self._prepare(tokens)
        metadata, tables = self._staged(batch, tokens)
        bucket.metadata.copy_(metadata, non_blocking=True)
        self.tables[: tables.shape[0], : tables.shape[1]].copy_(tables, non_blocking=True)
        if not (rows.data_ptr() == self.rows.data_ptr() and rows.shape[0] == batch.num_tokens):
            self.rows[: batch.num_tokens].copy_(rows)
        return bucket.step()[: batch.num_tokens]

    def _staged(self, batch: AttentionBatch | None, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A bucket's token metadata and the batch's table rows on the host (None: dummies only).

        Fresh pinned tensors each step: torch's pinned-memory cache reuses one only once its asynchronous copy
        has completed, so no step waits for the device and none overwrites a copy still in flight.
        """
        pin = self.spec.capture
        host = torch.empty((tokens, LIMIT + 1), dtype=torch.int64, pin_memory=pin)
        # Filled through a numpy view: no torch call per column (each releases and retakes the interpreter lock,
        # which decode's publishing competes for).
        filled = host.numpy()
        filled[:, POSITION], filled[:, SLOT], filled[:, ROW], filled[:, LIMIT] = \
            0, self.scratch_block * self.block_size, self.scratch_row, 1
        if batch is None:
            return host, torch.empty((0, 0), dtype=torch.int64)
        count = batch.num_tokens
        positions, query_start = batch.positions.numpy(), batch.query_start.numpy()
        filled[:count, POSITION], filled[:count, SLOT] = positions, batch.slot_mapping.numpy()
        filled[:count, ROW] = np.repeat(np.arange(batch.num_seqs), np.diff(query_start))
        filled[:count, LIMIT] = positions + 1  # causal: a token sees the cache up to itself
        tables = batch.block_tables
        if tables.dtype != torch.int64:  # built from int64 arrays already: a no-op call costs a lock hand-over
            tables = tables.to(torch.int64)
        return host, (tables.pin_memory() if pin else tables)

    def _prepare(self, tokens: int) -> _Bucket:
        """The bucket's static inputs and step: the talker over them, captured as a CUDA graph when asked."""
        metadata = torch.zeros((tokens, LIMIT + 1), dtype=torch.int64, device=self.kv_pool.device)
        batch = AttentionBatch(
            positions=metadata[:, POSITION], slot_mapping=metadata[:, SLOT], query_start=self.query_start[: tokens + 1],
            seq_lens=metadata[:, LIMIT], block_tables=self.tables, token_rows=metadata[:, ROW],
            token_limits=metadata[:, LIMIT], max_seq_len=self.spec.max_blocks_per_seq * self.block_size,
        )
        inputs = self.rows[:tokens]

        def forward() -> torch.Tensor:
            return self.talker(inputs, batch, self.kv_pool)

        step = forward
        metadata.copy_(self._staged(None, tokens)[0])  # warm-up and capture write only the scratch block
        if self.spec.capture:
            try:
                step = self._capture(forward)
            except RuntimeError:
                # Same results eagerly, only slower: a capture problem must not take the replica down.
                log.exception("capturing the talker step for %d tokens failed; it runs eagerly", tokens)
                self.num_capture_failures += 1
        self.prepared[tokens] = bucket = _Bucket(metadata, step)
        return bucket

    def _capture(self, forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        return cuda_graph.capture(forward, self.kv_pool.device, self.graph_pool)
