"""One forward shape of the slot decoder: `rows` streams x `frames` frames, with static inputs and output.

The step reads its inputs only from three buffers that live as long as it does (codes `[rows, frames, Q]`, slot
indices `[rows]` and each row's own chunk length `[rows]`: a shorter chunk rides padded at its end), gathers the slots'
states from the pool, runs the decoder and writes the states back, each row's taken where its own frames end. Nothing in
it reads the host, so on CUDA it is captured once as a graph and every call is a replay; elsewhere (or where a
capture fails) the same function runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.model.cuda_graph import capture
from services.model.codec.decoder import CodecDecoder
from services.model.codec.slot_pool import CodecSlotPool


class ShapeStep:
    """Decode `frames` frames for each of `rows` slots: the static buffers, and the eager forward or its replay."""

    def __init__(self, decoder: CodecDecoder, pool: CodecSlotPool, rows: int, frames: int) -> None:
        self.decoder, self.pool = decoder, pool
        self.rows, self.frames = rows, frames
        device = decoder.device
        # Zero codes at the scratch slot: until real inputs arrive, every row is padding (warm-up and capture run
        # the forward for real, and must not touch a request's state).
        self.codes = torch.zeros((rows, frames, decoder.config.num_quantizers), dtype=torch.long, device=device)
        self.slots = torch.full((rows,), pool.scratch, dtype=torch.long, device=device)
        self.lengths = torch.full((rows,), frames, dtype=torch.long, device=device)
        self._replay: Callable[[], torch.Tensor] | None = None

    @property
    def is_graphed(self) -> bool:
        return self._replay is not None

    def forward(self) -> torch.Tensor:
        """The step itself: float32 samples `[rows, frames * samples_per_frame]` (row r's own are the first
        `lengths[r]` frames' worth); updates the slots' states."""
        rows = self.pool.gather(self.slots, self.lengths, self.frames)
        audio = self.decoder.forward(self.codes, rows)
        self.pool.store(rows)
        return audio.float()

    def capture(self, graph_pool) -> None:
        """Capture `forward` as a CUDA graph drawing on `graph_pool`; raises what the capture raised."""
        with self.decoder.float32_convolutions():
            self._replay = capture(self.forward, self.decoder.device, graph_pool)

    def run(self, slots: torch.Tensor, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Copy host inputs (`slots` [rows], `codes` [rows, frames, Q] and `lengths` [rows], padding included: a
        padding row reads the scratch slot, a short chunk is padded at its end) in and run the step.

        A graphed step returns its static output: copy out of it before this step runs again.
        """
        self.slots.copy_(slots, non_blocking=True)
        self.codes.copy_(codes, non_blocking=True)
        self.lengths.copy_(lengths, non_blocking=True)
        if self._replay is not None:
            return self._replay()
        with self.decoder.float32_convolutions():
            return self.forward()
