"""CUDA graphs of a frame's sampling: codebook 0's logits and draw, then the code predictor's 15 steps and draws.

Eager, this part of an engine step issues thousands of kernels and is bound by their launches; replayed as a graph
it costs the device's time alone. `model_ops.sample_frames` has no host
synchronisation: every shape it picks comes from tensor shapes or from `RowSampling`'s host-side summaries
(`max_top_k`, `uses_top_p`, `is_all_greedy`). The sampler replaces each summary by a bound that holds for
any request of its kind (greedy decided per row; each side's mode: `FUSED` where no row uses top-p and the fused
sampler serves, one launch a draw whatever the top_k; else top-p applied, candidates cut at `TOP_K_CAP` unless a
row asks for more or for none), so every mix of requests shares one graph per

    (rows bucket, the talker's mode, the predictor's mode)

and the per-request values (temperature, top-k, top-p, penalty, seed) are tensor inputs. All of them are
captured up front (`prepare_all`). Rows pad up to a bucket (powers of two up to `max_rows`, as the talker's decode graphs do).
Every operation in it is row-wise (the talker head, the logit processing, the keyed sampler, the predictor's
per-row attention), so a padding row cannot change a real row; its codes are dropped. Padding rows hold
greedy defaults at first and afterwards whatever rows an earlier, larger step left there: finite values
of real requests, which is as harmless.

Inputs live in static buffers shared by every graph (rows [:B] are copied in before a replay); the output
codes are a view of the replayed graph's output, valid until the next call. At most `max_graphs` graphs are
kept, least recently used first out: each combination of sampling summaries would otherwise keep its own.
"""

from __future__ import annotations

import logging

from collections import OrderedDict
from collections.abc import Sequence
from typing import Callable

import torch

from services.engine import model_ops
from services.engine.graph_capture import GraphCapture
from services.engine.sampler_columns import (FRAME, KEYS, MIN_FRAMES, NUM_FRAMES, PENALTY, PER_REQUEST_INTS,
                                             PREDICTOR_TEMPERATURE, PREDICTOR_TOP_K, PREDICTOR_TOP_P, SEED,
                                             TALKER_TEMPERATURE, TALKER_TOP_K, TALKER_TOP_P)
from services.engine.slot_params import SlotParams
from services.engine.talker_graphs import buckets
from services.engine.errors import EngineError
from services.model.kernel_verdicts import KernelVerdicts
from services.model.loader import TTSModel
from services.model.sampling import RowSampling, SamplingParams, row_keys, row_keys_into
from services.model.talker_logits import MIN_NEW_TOKENS

TOP_K_CAP = 128
"""Candidates kept per row when every row's top_k is in 1..TOP_K_CAP (the released default is 50)."""

FUSED, CAPPED, WHOLE = "fused", "capped", "whole"
"""How one side (talker or predictor) of a graph draws: the fused sampler (no row uses top-p), or the top
candidates then the keyed draw, cut at TOP_K_CAP or over the whole vocabulary."""
GraphKey = tuple[int, str, str]
"""(rows bucket, the talker's mode, the predictor's mode)."""

log = logging.getLogger(__name__)


class FrameBucketError(EngineError, ValueError):
    """More rows were given to `PaddedFrameSampler.run` than its largest bucket holds."""

    code = "no_frame_bucket"


def needs_whole_vocabulary(rows: RowSampling) -> bool:
    """Whether some row keeps more candidates than TOP_K_CAP (top_k 0 keeps all of them)."""
    return _keeps_more_than_the_cap(rows.max_top_k)


def _keeps_more_than_the_cap(max_top_k: int | None) -> bool:
    return max_top_k is None or max_top_k > TOP_K_CAP


def sampling_mode(rows: RowSampling, vocab_size: int, kernels: KernelVerdicts) -> str:
    """The mode a side's rows need: FUSED where none uses top-p and the fused sampler serves (the model's `kernels`
    verdicts)."""
    return _mode(rows.uses_top_p, rows.max_top_k, vocab_size, kernels)


def params_mode(params: Sequence[SamplingParams], vocab_size: int, kernels: KernelVerdicts) -> str:
    """`sampling_mode` of the rows these parameters would build, read from the parameters on the host."""
    top_ks = [p.top_k for p in params]
    return _mode(any(p.top_p < 1.0 for p in params), None if 0 in top_ks else max(top_ks, default=0), vocab_size,
                 kernels)


def _mode(uses_top_p: bool, max_top_k: int | None, vocab_size: int, kernels: KernelVerdicts) -> str:
    if not uses_top_p and kernels.samples_whole_rows(vocab_size):
        return FUSED
    return WHOLE if _keeps_more_than_the_cap(max_top_k) else CAPPED


def mode_summary(mode: str) -> tuple[int | None, bool, bool]:
    """Summaries true for any rows of a mode, greedy rows chosen per row: FUSED, no top-p (the fused sampler keeps
    each row's own top_k); else top-p applied (a no-op where top_p is 1), candidates cut at TOP_K_CAP or none."""
    if mode == FUSED:
        return None, False, False
    return None if mode == WHOLE else TOP_K_CAP, True, False


class PaddedFrameSampler:
    """`model_ops.sample_frames` over static, padded inputs; graph-replayed per key when `capture`."""

    def __init__(self, model: TTSModel, max_rows: int, capture: bool = True,
                 max_graphs: int | None = None) -> None:
        """`capture` False runs the same padded, static-buffer step eagerly (the CPU tests' path).
        `max_graphs` None keeps every key's graph (9 per rows bucket)."""
        self.row_buckets = buckets(max_rows)
        max_graphs = 9 * len(self.row_buckets) if max_graphs is None else max_graphs
        if max_graphs < 1:
            raise FrameBucketError(f"max_graphs must be >= 1, got {max_graphs}")
        self.model, self.max_graphs = model, max_graphs
        device, vocab = model.device, model.config.talker.vocab_size
        self.hidden = torch.zeros((max_rows, model.talker.hidden_size), dtype=model.dtype, device=device)
        self.seen = torch.zeros((max_rows, vocab), dtype=torch.bool, device=device)
        self.ints = torch.zeros((max_rows, SEED + 1), dtype=torch.int64, device=device)
        self.floats = torch.zeros((max_rows, PREDICTOR_TOP_P + 1), dtype=torch.float32, device=device)
        # Padding rows start greedy, unpenalised, top-p off: a defined row whatever graph runs first.
        self.floats[:, PENALTY] = 1.0
        self.floats[:, TALKER_TOP_P] = self.floats[:, PREDICTOR_TOP_P] = 1.0
        self.graph_capture = GraphCapture(device, capture, log)
        self.graphs: OrderedDict[GraphKey, Callable[[], torch.Tensor]] = OrderedDict()
        self.captures = 0
        """How many steps were prepared (captured, when `capture`): evictions make it exceed len(graphs)."""

    @property
    def num_capture_failures(self) -> int:
        """Captures that failed; from the first one on, every step runs eagerly (logged, reported in the stats)."""
        return self.graph_capture.num_failures

    def prepare_all(self) -> None:
        """Prepare (capture) now the graphs requests take, so that no step after start-up pays for a capture: both
        sides fused (the released defaults have no top-p) where the fused sampler serves, and every mix of the
        top-p modes; a mix of a fused side with a top-p side is prepared when a step first needs it."""
        fused = all(self.model.kernels.samples_whole_rows(size) for size in self._vocab_sizes())
        pairs = [(talker, predictor) for talker in (CAPPED, WHOLE) for predictor in (CAPPED, WHOLE)]
        for rows in self.row_buckets:
            for key in [(rows, FUSED, FUSED)] * fused + [(rows, *pair) for pair in pairs]:
                if key not in self.graphs:
                    self._prepare(key)

    def _vocab_sizes(self) -> tuple[int, int]:
        talker = self.model.config.talker
        return talker.vocab_size, talker.code_predictor.vocab_size

    def bucket(self, num_rows: int) -> int | None:
        """The rows bucket of a batch of `num_rows`, or None if it is larger than every bucket."""
        return next((size for size in self.row_buckets if size >= num_rows), None)

    def run(self, hidden: torch.Tensor, seen: torch.Tensor, num_frames: torch.Tensor, penalty: torch.Tensor,
            talker_rows: RowSampling, predictor_rows: RowSampling,
            min_new_frames: torch.Tensor | None = None) -> torch.Tensor:
        """`model_ops.sample_frames(model, ...)` for B rows, same arguments and result [B, 16] (a view, valid
        until the next call). Both row samplings must be of the same rows (seeds and frames, as the runner
        builds them). Raises `FrameBucketError` if B is larger than every bucket."""
        count = hidden.shape[0]
        rows = self.bucket(count)
        if rows is None:
            raise FrameBucketError(f"{count} rows fit no frame bucket (largest {self.row_buckets[-1]}); "
                                   "check `bucket(rows)` first and sample such a step eagerly")
        kernels, (talker_vocab, predictor_vocab) = self.model.kernels, self._vocab_sizes()
        key: GraphKey = (rows, sampling_mode(talker_rows, talker_vocab, kernels),
                         sampling_mode(predictor_rows, predictor_vocab, kernels))
        self._stage(hidden, seen, num_frames, penalty, talker_rows, predictor_rows, min_new_frames)
        step = self.graphs.get(key)
        if step is None:
            step = self._prepare(key)
        self.graphs.move_to_end(key)
        return step()[:count]

    def run_from_slots(self, hidden: torch.Tensor, index: torch.Tensor, seen_table: torch.Tensor,
                       slot_params: SlotParams, modes: tuple[str, str]) -> torch.Tensor:
        """`run` for rows whose parameters and penalty rows are kept on the device, one row of each per request:
        hidden [B, H]; index [B, 2] int64 on the device, each row's (slot, frame index); `seen_table` and
        `slot_params` indexed by slot; `modes`: (talker, predictor) from `params_mode`. A step's host work is then
        this call's few launches, whatever the batch's mix of sampling parameters."""
        count = hidden.shape[0]
        rows = self.bucket(count)
        if rows is None:
            raise FrameBucketError(f"{count} rows fit no frame bucket (largest {self.row_buckets[-1]})")
        slots, frames = index[:, 0], index[:, 1]
        self.hidden[:count].copy_(hidden)
        torch.index_select(seen_table, 0, slots, out=self.seen[:count])
        ints = self.ints[:count]
        ints[:, NUM_FRAMES : FRAME + 1] = frames[:, None]
        ints[:, PER_REQUEST_INTS] = slot_params.ints.index_select(0, slots)
        row_keys_into(ints[:, SEED], frames, out=ints[:, KEYS : KEYS + 2])
        torch.index_select(slot_params.floats, 0, slots, out=self.floats[:count])
        key: GraphKey = (rows, *modes)
        step = self.graphs.get(key)
        if step is None:
            step = self._prepare(key)
        self.graphs.move_to_end(key)
        return step()[:count]

    def _stage(self, hidden: torch.Tensor, seen: torch.Tensor, num_frames: torch.Tensor, penalty: torch.Tensor,
               talker_rows: RowSampling, predictor_rows: RowSampling, min_new_frames: torch.Tensor | None) -> None:
        """Copy the batch's rows into rows [:B] of the static inputs (device to device; no host sync)."""
        count = hidden.shape[0]
        keys = talker_rows.keys if talker_rows.keys is not None else predictor_rows.keys
        if keys is None:  # both all-greedy: never read (zeros); else hashed as `sample` would
            both_greedy = talker_rows.is_all_greedy and predictor_rows.is_all_greedy
            seed = talker_rows.seed
            keys = seed.new_zeros((count, 2)) if both_greedy else row_keys(seed, talker_rows.frame)
        if min_new_frames is None:
            min_new_frames = torch.full_like(num_frames, MIN_NEW_TOKENS)
        self.hidden[:count].copy_(hidden)
        self.seen[:count].copy_(seen)
        self.ints[:count].copy_(torch.stack((
            num_frames.to(torch.int64), talker_rows.frame, keys[:, 0], keys[:, 1], min_new_frames.to(torch.int64),
            talker_rows.top_k, predictor_rows.top_k, talker_rows.seed), dim=1))
        self.floats[:count].copy_(torch.stack((
            penalty.to(torch.float32), talker_rows.temperature, talker_rows.top_p, predictor_rows.temperature,
            predictor_rows.top_p), dim=1))

    def _forward(self, key: GraphKey) -> Callable[[], torch.Tensor]:
        """`sample_frames` over rows [:bucket] of the static inputs, with summaries that hold for any rows."""
        rows, talker_summary, predictor_summary = key[0], mode_summary(key[1]), mode_summary(key[2])
        ints, floats = self.ints[:rows], self.floats[:rows]
        seed, frame = ints[:, SEED], ints[:, FRAME]
        talker = RowSampling(floats[:, TALKER_TEMPERATURE], ints[:, TALKER_TOP_K], floats[:, TALKER_TOP_P], seed,
                             frame, *talker_summary, keys=None if talker_summary[2] else ints[:, KEYS : KEYS + 2])
        predictor = RowSampling(floats[:, PREDICTOR_TEMPERATURE], ints[:, PREDICTOR_TOP_K],
                                floats[:, PREDICTOR_TOP_P], seed, frame, *predictor_summary,
                                keys=None if predictor_summary[2] else ints[:, KEYS : KEYS + 2])
        hidden, seen = self.hidden[:rows], self.seen[:rows]

        def forward() -> torch.Tensor:
            return model_ops.sample_frames(self.model, hidden, seen, ints[:, NUM_FRAMES], floats[:, PENALTY],
                                           talker, predictor, ints[:, MIN_FRAMES])

        return forward

    def _prepare(self, key: GraphKey) -> Callable[[], torch.Tensor]:
        rows, talker_mode, predictor_mode = key
        name = f"the sampling step (rows bucket {rows}, talker {talker_mode}, predictor {predictor_mode})"
        step = self.graph_capture.graph_or_eager(self._forward(key), name)
        self.captures += 1
        self.graphs[key] = step
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)  # its graph's memory goes back to the shared pool
        return step
