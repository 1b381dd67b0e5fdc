"""What each running request drew, kept on the device: the codebook-0 ids it already drew (the repetition
penalty's memory) and its last frame's 16 codes (the input of its next decode step).

One row per running request, updated in place from each step's sampled codes, so a step's host work stays
O(batch) however long the requests run, and the next step's inputs never wait for codes to reach the host. A
request's row is (re)built from its stored frames only when it first samples after admission or a replay (or
after a step whose codes were not applied); rows are freed when the request leaves the running set.
"""

from __future__ import annotations

import torch

from services.engine.errors import EngineError
from services.engine.sequence import NUM_CODEBOOKS, Sequence
from services.model.uploads import upload


class SeenTableFull(EngineError, RuntimeError):
    """More requests sampled at once than the table has rows (the scheduler caps them at max_num_seqs)."""

    code = "seen_table_full"


class SeenTable:
    """Rows on the device, one per running request, keyed by request id: `table` [num_rows, vocab] bool (ids drawn)
    and `last_frames` [num_rows, 16] int64 (the codes of the request's newest frame)."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.table = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=device)
        self.last_frames = torch.zeros((num_rows, NUM_CODEBOOKS), dtype=torch.int64, device=device)
        self._slots: dict[str, int] = {}
        self._folded: dict[str, int] = {}
        """Frames already marked in each request's row; a mismatch with its frames means the row is stale."""
        self._free = list(range(num_rows - 1, -1, -1))
        self._true = torch.ones((), dtype=torch.bool, device=device)
        """The value `mark` writes, made once: a Python True would be copied from the host, a sync each step."""

    def slots_of(self, seqs: list[Sequence]) -> list[int]:
        """The rows of `seqs`, each up to date with its request's frames (those still on the device included),
        for a step that samples a frame of each and `mark`s it."""
        slots = []
        for seq in seqs:
            slot = self._slots.get(seq.request_id)
            if slot is None:
                if not self._free:
                    raise SeenTableFull(f"{len(self._slots)} requests hold every repetition-penalty row")
                slot = self._slots[seq.request_id] = self._free.pop()
                self._refill(slot, seq)
            elif self._folded[seq.request_id] != seq.num_sampled_frames:
                self._refill(slot, seq)
            self._folded[seq.request_id] = seq.num_sampled_frames + 1  # after `mark`, this step's frame is in
            slots.append(slot)
        return slots

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, slots)

    def mark(self, slots: torch.Tensor, codes: torch.Tensor) -> None:
        """Record each row's newly drawn frame [B, 16] (on the device, no host read)."""
        self.table.index_put_((slots, codes[:, 0]), self._true)
        self.last_frames.index_copy_(0, slots, codes)

    def release(self, request_id: str) -> int | None:
        """Free the request's row; returns it (None if the request held none)."""
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            del self._folded[request_id]
            self._free.append(slot)
        return slot

    def clear(self) -> list[int]:
        """Free every row; returns the rows that were held."""
        return [self.release(request_id) for request_id in list(self._slots)]

    def _refill(self, slot: int, seq: Sequence) -> None:
        if seq.num_pending_frames:
            # Only the frames on the host can be folded in; a row is rebuilt only where none is pending.
            raise EngineError(f"request {seq.request_id}: its penalty row is rebuilt while "
                              f"{seq.num_pending_frames} frame(s) are still on the device")
        row = self.table[slot]
        row.zero_()
        self.last_frames[slot] = 0
        if seq.num_frames:
            frames = upload(seq.frames.clone(), row.device)
            row.index_fill_(0, frames[:, 0], True)
            self.last_frames[slot] = frames[-1]
