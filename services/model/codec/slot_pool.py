"""Every request's codec state in a fixed slot of preallocated pools, so that a batch is a tensor of slot indices.

One flat buffer holds each slot's conv histories and K/V windows side by side (`[slots, state elements]`, a row per
slot) and a second its frame position. A forward gathers its rows by index (`index_select`), runs on that copy, and
writes the updated rows back (on CUDA each layer's tails straight into the pool, `fused_tail_store`; else
`index_copy_`): no Python loop over requests and no host sync, so the whole step can be captured as a CUDA graph
whose only inputs are codes, slot indices and each row's chunk length.

Two slots past `max_streams` serve padding rows (a batch padded up to its bucket): padding rows read `scratch`,
which nothing ever writes, so it stays a fresh stream's zero state, and write to `sink`, which nothing reads. So a
padding row computes the same thing every time and never touches a request's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.model.codec.errors import CodecError, CodecInputError
from services.kernels.codec.fused_tail_store import store_tails
from services.model.codec.stream_state import StreamLayout
from services.kernels.triton_support import compiles_for


class SlotsExhausted(CodecError):
    """Every slot of the pool holds a stream: a caller admitted more concurrent streams than the pool was sized for."""


class SlotRows:
    """The pool rows of one forward's batch, gathered by slot index (the `StreamRows` the decoder's modules read).

    A pass runs `frames` frames a row, and row r's chunk has `lengths[r]` of them (a shorter chunk rides in a longer
    pass, padded at its end: every layer is causal, so the padding never reaches the row's own outputs). Its state
    tails are taken where its own frames end, and its position advances by its own length. With the fused kernels
    (CUDA) each tail goes straight into the pool row `targets[r]` as its layer keeps it, one launch a state; else it
    is gathered here and `CodecSlotPool.store` copies it in.
    """

    def __init__(self, pool: CodecSlotPool, slots: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor,
                 frames: int) -> None:
        self.positions = pool.positions.index_select(0, slots)
        self.conv_histories, self.keys, self.values = pool.views(pool.flat.index_select(0, slots))
        self.lengths, self.frames = lengths, frames
        self._pool, self.targets = pool, targets
        self.stores_directly = compiles_for(slots.device)
        """Each layer writes its tails into the pool as it keeps them (CUDA); else `CodecSlotPool.store` copies the
        gathered rows back."""
        self._tail_starts: dict[tuple[int, int], torch.Tensor] = {}

    def keep_history(self, slot: int, full: torch.Tensor, history: int) -> None:
        if self.stores_directly:
            self._store(full, history, self._pool.conv_histories[slot])
        else:
            self.conv_histories[slot] = self._tail(full, history)

    def keep_window(self, layer: int, keys: torch.Tensor, values: torch.Tensor, window: int) -> None:
        if self.stores_directly:
            self._store(keys, window, self._pool.keys[layer])
            self._store(values, window, self._pool.values[layer])
        else:
            self.keys[layer], self.values[layer] = self._tail(keys, window), self._tail(values, window)

    def _per_frame(self, full: torch.Tensor, history: int) -> int:
        return (full.shape[2] - history) // self.frames  # a layer's entries per frame: its rate

    def _store(self, full: torch.Tensor, history: int, pool: torch.Tensor) -> None:
        store_tails(full, history, self._per_frame(full, history), self.lengths, self.targets, pool)

    def _tail(self, full: torch.Tensor, history: int) -> torch.Tensor:
        """Row r's `history` entries of `full` along dim 2 ending after its own frames, gathered."""
        starts = self._starts(self._per_frame(full, history), history)  # [B, history]
        index = starts.view(full.shape[0], 1, history, *([1] * (full.dim() - 3)))
        return torch.gather(full, 2, index.expand(*full.shape[:2], history, *full.shape[3:]))

    def _starts(self, per_frame: int, history: int) -> torch.Tensor:
        # Layers at one rate and look-back share the index: made once a forward, not once a layer.
        key = (per_frame, history)
        starts = self._tail_starts.get(key)
        if starts is None:
            offsets = torch.arange(history, device=self.lengths.device)
            starts = self._tail_starts[key] = (self.lengths * per_frame)[:, None] + offsets
        return starts


class CodecSlotPool:
    """The states of up to `max_streams` streams, one slot each, on the decoder's device and dtype.

    `acquire()` hands out a free slot holding a fresh stream's state; `release()` takes it back. Both run on the
    thread that runs the decoder (they write the pool), in order with the forwards.
    """

    def __init__(self, layout: StreamLayout, max_streams: int, device: torch.device, dtype: torch.dtype) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.layout = layout
        self.max_streams = max_streams
        self.scratch = max_streams
        self.sink = max_streams + 1
        shapes = [*layout.conv_history_shapes] + [layout.kv_shape] * (2 * layout.num_layers)
        self._shapes = [tuple(shape) for shape in shapes]
        self._offsets = [0]
        for shape in self._shapes:
            self._offsets.append(self._offsets[-1] + _numel(shape))
        # Zero history is exactly the zero padding a full decode applies at the start.
        self.flat = torch.zeros((max_streams + 2, self._offsets[-1]), device=device, dtype=dtype)
        self.positions = torch.zeros(max_streams + 2, device=device, dtype=torch.long)
        self.conv_histories, self.keys, self.values = self.views(self.flat)
        self._free = list(range(max_streams - 1, -1, -1))  # pop() hands out the lowest slot first
        self._in_use: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def views(self, flat: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Conv histories, keys and values as `[rows, *shape]` views of `flat` ([rows, state elements])."""
        tensors = [flat[:, start:end].view(flat.shape[0], *shape)
                   for shape, start, end in zip(self._shapes, self._offsets, self._offsets[1:])]
        num_convs, num_layers = len(self.layout.conv_history_shapes), self.layout.num_layers
        return tensors[:num_convs], tensors[num_convs:num_convs + num_layers], tensors[num_convs + num_layers:]

    def acquire(self) -> int:
        """A free slot, reset to a fresh stream's state (zero history, frame 0)."""
        if not self._free:
            raise SlotsExhausted("slots_exhausted", f"all {self.max_streams} codec stream slots are in use; the "
                                                    "caller must bound its concurrent streams by the pool's size")
        slot = self._free.pop()
        self.flat[slot].zero_()
        self.positions[slot].zero_()
        self._in_use.add(slot)
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back; its rows are reset when it is next acquired."""
        self.check_in_use(slot)
        self._in_use.remove(slot)
        self._free.append(slot)

    def check_in_use(self, slot: int) -> None:
        if slot not in self._in_use:
            raise CodecInputError("slot_not_in_use", f"codec slot {slot} is not held by a stream")

    def gather(self, slots: torch.Tensor, lengths: torch.Tensor, frames: int) -> SlotRows:
        """The rows of `slots` ([rows] long, on the pool's device), copied out for one forward of `frames` frames
        in which row r's chunk has `lengths[r]` ([rows] long, on the device); its states go back to `slots`, a
        padding row's (`scratch`) to `sink`."""
        return SlotRows(self, slots, self.padding_to_sink(slots), lengths, frames)

    def padding_to_sink(self, slots: torch.Tensor) -> torch.Tensor:
        """Where each row's updated state goes: its own slot, or `sink` for a padding row."""
        return torch.where(slots == self.scratch, self.sink, slots)

    def store(self, rows: SlotRows) -> None:
        """Write a forward's updated rows back to their slots (unless its layers stored them already) and advance
        each by its own chunk's length."""
        targets = rows.targets
        if not rows.stores_directly:  # a state no layer kept is copied back unchanged: the same as not copying it
            for pool, updated in zip(self.conv_histories + self.keys + self.values,
                                     rows.conv_histories + rows.keys + rows.values):
                pool.index_copy_(0, targets, updated)
        self.positions.index_copy_(0, targets, rows.positions + rows.lengths)

    def snapshot(self, slot: int) -> SlotSnapshot:
        """A copy of the stream's state in `slot` (on the device: no host sync)."""
        self.check_in_use(slot)
        return SlotSnapshot(self.flat[slot].clone(), self.positions[slot].clone())

    def restore(self, slot: int, snapshot: SlotSnapshot) -> None:
        """Put `snapshot`'s state in `slot`: the stream continues from where the snapshot's stream stood."""
        self.check_in_use(slot)
        self.flat[slot].copy_(snapshot.row)
        self.positions[slot].copy_(snapshot.position)

    def num_frames(self, slot: int) -> int:
        """Frames decoded so far by the stream in `slot` (a host sync: for tests and logs, not the hot path)."""
        self.check_in_use(slot)
        return int(self.positions[slot])


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """One stream's whole state: its pool row and its frame position."""

    row: torch.Tensor
    position: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return self.row.numel() * self.row.element_size()


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
