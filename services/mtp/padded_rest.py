"""An mtp replica's steps as CUDA graphs: codebooks 1..15 over static, padded inputs, one replay a step.

Eager, one step of the code predictor is some thousand launches from Python (15 codebooks x 5 layers, the draws),
so an eager replica is bound by their launches, not by the device. Decode replays the same work as a graph
(`services/engine/predictor_graphs.py`);
here it is the predictor's part alone, graphed the same way:

- rows pad up to a bucket (powers of two up to `max_rows`, the buckets decode's graphs use, so a step of B rows runs
  the same shapes here as it would in decode), one graph per (rows bucket, sampling mode), the mode as decode's
  (`sampling_mode`: the fused draws where no row uses top-p, else top-p with candidates capped or not);
- each step's rows are copied into rows [:B] of static inputs (hidden states, codebook 0, temperature, top-k, top-p,
  the hash keys of the rows' seeds and frames); per-row values are tensors, so every mix of requests of a mode shares
  its graph;
- every operation is row-wise (the predictor's per-row attention, the keyed draws), so a padding row cannot change
  a real one; its codes are dropped.

With `capture` False (the CPU) the same padded step runs eagerly: the CPU tests check it gives `predict_rest`'s codes.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from services.engine.graph_capture import GraphCapture
from services.engine.model_ops import predict_rest
from services.engine.predictor_graphs import mode_summary, sampling_mode
from services.engine.talker_graphs import buckets
from services.model.loader import TTSModel
from services.model.sampling import RowSampling, SamplingParams, row_keys

log = logging.getLogger(__name__)

TOP_K, KEYS = 0, 1
"""Columns of the static int64 inputs (KEYS takes two: the keyed sampler's hash lanes). No seed or frame: the step's
sampling always carries the keys hashed from them, and `sample` reads seed and frame only to hash missing keys."""
TEMPERATURE, TOP_P = 0, 1
"""Columns of the static float32 inputs."""

GraphKey = tuple[int, str]
"""(rows bucket, sampling mode)."""


class PaddedRestPredictor:
    """`predict_rest` over static, padded inputs; graph-replayed per key when `capture`."""

    def __init__(self, model: TTSModel, max_rows: int, capture: bool | None = None) -> None:
        device = model.device
        self.model = model
        self.row_buckets = buckets(max_rows)
        width = model.config.talker.decoder.hidden_size
        self.hidden = torch.zeros((max_rows, width), dtype=model.dtype, device=device)
        self.c0 = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.ints = torch.zeros((max_rows, KEYS + 2), dtype=torch.int64, device=device)
        self.floats = torch.ones((max_rows, TOP_P + 1), dtype=torch.float32, device=device)
        self.floats[:, TEMPERATURE] = 0.0  # padding rows start greedy, top-p off
        self.graph_capture = GraphCapture(device, device.type == "cuda" if capture is None else capture, log)
        self.graphs: dict[GraphKey, Callable[[], torch.Tensor]] = {}

    @property
    def num_capture_failures(self) -> int:
        """Captures that failed; from the first one on, every step runs eagerly (logged)."""
        return self.graph_capture.num_failures

    def prepare_all(self) -> None:
        """Prepare (capture) every bucket's graph of the default requests' mode now: no step after start-up pays for
        it; other modes are prepared when a step first needs them."""
        default = RowSampling.build([SamplingParams()], [0], [0], self.model.device)
        mode = sampling_mode(default, self._vocab_size(), self.model.kernels)
        for rows in self.row_buckets:
            self._step((rows, mode))

    def bucket(self, num_rows: int) -> int | None:
        """The rows bucket of a step of `num_rows`, or None if it is larger than every bucket (run it eagerly)."""
        return next((size for size in self.row_buckets if size >= num_rows), None)

    def predict(self, hidden: torch.Tensor, c0: torch.Tensor, rows: RowSampling) -> torch.Tensor:
        """`predict_rest(model, hidden, c0, rows)`: codebooks 1..15 [B, 15] (a view, valid until the next call)."""
        count = hidden.shape[0]
        bucket = self.bucket(count)
        if bucket is None:
            return predict_rest(self.model, hidden, c0, rows)
        self._stage(hidden, c0, rows)
        mode = sampling_mode(rows, self._vocab_size(), self.model.kernels)
        return self._step((bucket, mode))()[:count]

    def _stage(self, hidden: torch.Tensor, c0: torch.Tensor, rows: RowSampling) -> None:
        count = hidden.shape[0]
        keys = rows.keys if rows.keys is not None else row_keys(rows.seed, rows.frame)
        self.hidden[:count].copy_(hidden)
        self.c0[:count].copy_(c0)
        self.ints[:count].copy_(torch.stack((rows.top_k, keys[:, 0], keys[:, 1]), dim=1))
        self.floats[:count].copy_(torch.stack((rows.temperature, rows.top_p), dim=1))

    def _step(self, key: GraphKey) -> Callable[[], torch.Tensor]:
        step = self.graphs.get(key)
        if step is not None:
            return step
        rows, mode = key
        step = self.graph_capture.graph_or_eager(self._forward(key),
                                                 f"the code predictor's step (rows bucket {rows}, {mode})")
        self.graphs[key] = step
        return step

    def _forward(self, key: GraphKey) -> Callable[[], torch.Tensor]:
        rows, mode = key
        ints, floats = self.ints[:rows], self.floats[:rows]
        # Never all-greedy and always keyed (`mode_summary`), so `sample` never reads seed or frame; a RowSampling
        # still takes them, and its row count is theirs: zeros of the bucket's rows stand in.
        unread = ints.new_zeros(rows)
        sampling = RowSampling(floats[:, TEMPERATURE], ints[:, TOP_K], floats[:, TOP_P], unread, unread,
                               *mode_summary(mode), keys=ints[:, KEYS:])
        hidden, c0 = self.hidden[:rows], self.c0[:rows]

        def forward() -> torch.Tensor:
            return predict_rest(self.model, hidden, c0, sampling)

        return forward

    def _vocab_size(self) -> int:
        return self.model.config.talker.code_predictor.vocab_size
