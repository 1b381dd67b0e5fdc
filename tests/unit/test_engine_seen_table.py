"""The per-request device rows: codebook-0 ids drawn and the last frame, filled from stored frames once, then
updated in place by each step."""

from __future__ import annotations

import pytest
import torch

from services.engine.errors import EngineError
from services.engine.seen_table import SeenTable, SeenTableFull
from services.engine.sequence import Sequence
from services.model.sampling import SamplingParams


def _seq(request_id: str, first_codes: list[int]) -> Sequence:
    seq = Sequence(request_id, 4, seed=1, params=SamplingParams(), max_new_frames=50)
    for code in first_codes:
        seq.append_frame(_frame(code))
    return seq


def _frame(code: int) -> torch.Tensor:
    return torch.arange(16, dtype=torch.int64) + code  # codebook 0 is `code`, the others differ from it


def _frames(*codes: int) -> torch.Tensor:
    return torch.stack([_frame(code) for code in codes])


def _rows(table: SeenTable, slots: list[int]) -> torch.Tensor:
    return table.rows(torch.tensor(slots))


def test_rows_follow_the_frames_and_are_rebuilt_only_when_stale():
    table = SeenTable(num_rows=2, vocab_size=10, device=torch.device("cpu"))
    a, b = _seq("a", [3, 5]), _seq("b", [])
    slots = table.slots_of([a, b])
    assert torch.equal(_rows(table, slots)[0].nonzero().flatten(), torch.tensor([3, 5]))
    assert not _rows(table, slots)[1].any()
    assert torch.equal(table.last_frames[slots[0]], _frame(5))  # a's next decode input
    table.mark(torch.tensor(slots), _frames(7, 1))
    assert torch.equal(table.last_frames[slots], _frames(7, 1))
    a.append_frame(_frame(7)), b.append_frame(_frame(1))
    again = table.slots_of([b, a])  # order changes nothing: rows are keyed by request
    assert again == slots[::-1]
    assert _rows(table, again)[1].nonzero().flatten().tolist() == [3, 5, 7]
    # A step whose output was dropped leaves the row behind the frames: it is rebuilt from them.
    table.mark(torch.tensor(again), _frames(9, 9))
    assert _rows(table, table.slots_of([a]))[0].nonzero().flatten().tolist() == [3, 5, 7]
    assert torch.equal(table.last_frames[slots[0]], _frame(7))


def test_a_frame_still_on_the_device_counts_and_a_row_is_never_rebuilt_without_it():
    table = SeenTable(num_rows=1, vocab_size=10, device=torch.device("cpu"))
    a = _seq("a", [3])
    slots = table.slots_of([a])
    table.mark(torch.tensor(slots), _frames(6))
    a.num_pending_frames = 1  # step N's frame is on the device; step N+1 is prepared meanwhile
    assert table.slots_of([a]) == slots  # up to date: no rebuild from the host's frames
    assert _rows(table, slots)[0].nonzero().flatten().tolist() == [3, 6]
    table.mark(torch.tensor(slots), _frames(8))
    # Step N+1's output was not applied (the row is stale) while a frame is still pending: refuse, do not guess.
    with pytest.raises(EngineError):
        table.slots_of([a])


def test_released_rows_are_reused_clean_and_a_full_table_says_so():
    table = SeenTable(num_rows=1, vocab_size=10, device=torch.device("cpu"))
    table.mark(torch.tensor(table.slots_of([_seq("a", [2])])), _frames(4))
    with pytest.raises(SeenTableFull):
        table.slots_of([_seq("b", [])])
    table.release("a")
    slots = table.slots_of([_seq("b", [])])
    assert not _rows(table, slots).any()
    assert not table.last_frames[slots].any()
