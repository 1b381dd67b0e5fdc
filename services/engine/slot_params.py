"""Each running request's sampling parameters, kept on the device in the row of its `SeenTable` slot.

A request's parameters (temperatures, top-k, top-p, repetition penalty, seed, minimum frames) never change while it
runs, so they are written once, when the request takes its slot, and every graphed step gathers its rows' values
on the device by slot (`PaddedFrameSampler.run_from_slots`) instead of building and uploading them from the host
each step: at a large batch that host work is a sizeable share of the engine thread's time.
The columns are the frame sampler's own (`sampler_columns`), so a step copies them as they are.
"""

from __future__ import annotations

import numpy as np
import torch

from services.engine.sampler_columns import (MIN_FRAMES, PENALTY, PER_REQUEST_INTS, PREDICTOR_TEMPERATURE,
                                             PREDICTOR_TOP_K, PREDICTOR_TOP_P, SEED, TALKER_TEMPERATURE,
                                             TALKER_TOP_K, TALKER_TOP_P)
from services.engine.sequence import Sequence
from services.model.sampling import as_int64
from services.model.uploads import upload

_INT_WIDTH = PER_REQUEST_INTS.stop - PER_REQUEST_INTS.start
_FLOAT_WIDTH = PREDICTOR_TOP_P + 1
_PACKED_INTS = slice(1, 1 + _INT_WIDTH)
"""Columns of a `hold` upload: the slot, then the ints, then the floats' bits (two float32 to an int64 column)."""
_PACKED_FLOATS = slice(_PACKED_INTS.stop, _PACKED_INTS.stop + (_FLOAT_WIDTH + 1) // 2)
_PACKED_WIDTH = _PACKED_FLOATS.stop


class SlotParams:
    """`ints` [rows, 4] int64 (minimum frames, talker top-k, predictor top-k, seed) and `floats` [rows, 5] float32
    (penalty, talker temperature and top-p, predictor temperature and top-p), one row per `SeenTable` slot."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        self.ints = torch.zeros((num_rows, _INT_WIDTH), dtype=torch.int64, device=device)
        self.floats = torch.zeros((num_rows, _FLOAT_WIDTH), dtype=torch.float32, device=device)
        # A row no request holds (padding, the scratch slot) samples greedily, unpenalised, top-p off.
        self.floats[:, PENALTY] = 1.0
        self.floats[:, TALKER_TOP_P] = self.floats[:, PREDICTOR_TOP_P] = 1.0
        self._holder: list[str | None] = [None] * num_rows

    def hold(self, slots: list[int], seqs: list[Sequence]) -> None:
        """Make each slot's row hold its request's parameters; only slots taken since the last call are written
        (one upload for all of them: slots, ints and floats packed in one int64 block), so a step of requests
        already seated costs a comparison per row.

        One upload, not one per field: each torch call on the engine thread hands the interpreter lock over and
        must win it back from decode's event loop, so a step that seats a request (a mixed one) would otherwise
        spend most of its extra launch time here."""
        fresh = [(slot, seq) for slot, seq in zip(slots, seqs) if self._holder[slot] != seq.request_id]
        if not fresh:
            return
        packed = np.zeros((len(fresh), _PACKED_WIDTH), dtype=np.int64)
        ints = packed[:, _PACKED_INTS]
        floats = packed[:, _PACKED_FLOATS].view(np.float32)  # the float columns' bits, two to an int64
        start = PER_REQUEST_INTS.start
        for row, (slot, seq) in enumerate(fresh):
            talker, predictor = seq.params, seq.predictor_params
            packed[row, 0] = slot
            ints[row, [MIN_FRAMES - start, TALKER_TOP_K - start, PREDICTOR_TOP_K - start, SEED - start]] = \
                seq.min_new_frames, talker.top_k, predictor.top_k, as_int64(seq.seed)
            floats[row, [PENALTY, TALKER_TEMPERATURE, TALKER_TOP_P, PREDICTOR_TEMPERATURE, PREDICTOR_TOP_P]] = \
                talker.repetition_penalty, talker.temperature, talker.top_p, predictor.temperature, predictor.top_p
            self._holder[slot] = seq.request_id
        block = upload(torch.from_numpy(packed), self.ints.device)
        self.ints.index_copy_(0, block[:, 0], block[:, _PACKED_INTS])
        self.floats.index_copy_(0, block[:, 0], block[:, _PACKED_FLOATS].view(torch.float32)[:, :_FLOAT_WIDTH])

    def vacate(self, slot: int) -> None:
        """The slot's request left: the next request seated there is written, whatever its id."""
        self._holder[slot] = None
