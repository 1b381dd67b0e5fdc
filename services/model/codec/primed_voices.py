"""Codec states primed with a cloned voice's reference frames, kept by the frames' content, so a voice heard again
skips its priming.

An in-context clone's first chunk carries the reference's codec frames (75 for a 6-s reference, up to 375 for 30 s),
which the vocoder decodes into the request's codec state before voicing anything: the model's audio continues the
reference's. That is a decoder forward over every reference frame (on the vocoder's priming thread, beside its
batched calls). Done once per distinct reference, the state it leaves (the slot's pool row and frame position) is
kept here, and a request bringing the same frames (a saved voice, a caller sending its reference again) gets a copy:
the state its own priming would leave, for the price of copying one row.

Least recently used states go first. Each costs one pool row (`num_bytes`, a few MB for the released codec) of the
decoder's device memory.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from services.model.codec.slot_pool import SlotSnapshot


class PrimedVoices:
    """Up to `capacity` primed states by context key (0: none kept)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._states: OrderedDict[bytes, SlotSnapshot] = OrderedDict()
        self.num_bytes = 0
        """What the kept states hold: a plain count, so another thread (STATS) reads it without iterating."""

    @staticmethod
    def key(context: np.ndarray) -> bytes:
        """The content key of reference frames [m, 16]: their values and shape, whatever their integer dtype."""
        frames = np.ascontiguousarray(context, dtype=np.int64)
        digest = hashlib.blake2b(np.asarray(frames.shape, dtype=np.int64).tobytes(), digest_size=20)
        digest.update(frames.tobytes())
        return digest.digest()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: bytes) -> SlotSnapshot | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
        return state

    def put(self, key: bytes, state: SlotSnapshot) -> None:
        if self.capacity == 0:
            return
        replaced = self._states.pop(key, None)
        self.num_bytes += state.num_bytes - (replaced.num_bytes if replaced is not None else 0)
        self._states[key] = state
        while len(self._states) > self.capacity:
            self.num_bytes -= self._states.popitem(last=False)[1].num_bytes
