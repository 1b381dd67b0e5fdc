"""The repetition penalty's memory: which codebook-0 ids each running request already drew, kept on the device.

One bool row per running request, updated in place from each step's sampled codes, so a step's host work
stays O(batch) however long the requests run. A request's row is (re)built from its stored frames only when
it first samples after admission or a replay; rows are freed when the request leaves the running set.
"""

from __future__ import annotations

import torch

from services.engine.errors import EngineError
from services.engine.sequence import Sequence
from services.model.uploads import upload


class SeenTableFull(EngineError, RuntimeError):
    """More requests sampled at once than the table has rows (the scheduler caps them at max_num_seqs)."""

    code = "seen_table_full"


class SeenTable:
    """Bool rows [num_rows, vocab] on the device, one per running request, keyed by request id."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.table = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=device)
        self._slots: dict[str, int] = {}
        self._folded: dict[str, int] = {}
        """Frames already marked in each request's row; a mismatch with its frames means the row is stale."""
        self._free = list(range(num_rows - 1, -1, -1))
        self._true = torch.ones((), dtype=torch.bool, device=device)
        """The value `mark` writes, made once: a Python True would be copied from the host, a sync each step."""

    def slots_of(self, seqs: list[Sequence]) -> torch.Tensor:
        """The rows of `seqs` as an index tensor on the device, each row up to date with its request's frames."""
        slots = []
        for seq in seqs:
            slot = self._slots.get(seq.request_id)
            if slot is None:
                if not self._free:
                    raise SeenTableFull(f"{len(self._slots)} requests hold every repetition-penalty row")
                slot = self._slots[seq.request_id] = self._free.pop()
                self._refill(slot, seq)
            elif self._folded[seq.request_id] != seq.num_frames:
                self._refill(slot, seq)
            self._folded[seq.request_id] = seq.num_frames + 1  # after `mark`, this step's frame is in
            slots.append(slot)
        return upload(torch.tensor(slots, dtype=torch.int64), self.table.device)

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, slots)

    def mark(self, slots: torch.Tensor, first_codes: torch.Tensor) -> None:
        """Record each row's newly drawn codebook-0 id (on the device, no host read)."""
        self.table.index_put_((slots, first_codes), self._true)

    def release(self, request_id: str) -> None:
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            del self._folded[request_id]
            self._free.append(slot)

    def clear(self) -> None:
        for request_id in list(self._slots):
            self.release(request_id)

    def _refill(self, slot: int, seq: Sequence) -> None:
        row = self.table[slot]
        row.zero_()
        if seq.num_frames:
            row.index_fill_(0, upload(seq.frames[:, 0].clone(), row.device), True)
