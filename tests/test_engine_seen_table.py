"""The repetition penalty's device-side rows: filled from stored frames once, then updated in place."""

from __future__ import annotations

import pytest
import torch

from services.engine.seen_table import SeenTable, SeenTableFull
from services.engine.sequence import Sequence
from services.model.sampling import SamplingParams


def _seq(request_id: str, first_codes: list[int]) -> Sequence:
    seq = Sequence(request_id, 4, seed=1, params=SamplingParams(), max_new_frames=50)
    for code in first_codes:
        seq.append_frame(torch.full((16,), code, dtype=torch.int64))
    return seq


def test_rows_follow_the_frames_and_are_rebuilt_only_when_stale():
    table = SeenTable(num_rows=2, vocab_size=10, device=torch.device("cpu"))
    a, b = _seq("a", [3, 5]), _seq("b", [])
    slots = table.slots_of([a, b])
    assert torch.equal(table.rows(slots)[0].nonzero().flatten(), torch.tensor([3, 5]))
    assert not table.rows(slots)[1].any()
    table.mark(slots, torch.tensor([7, 1]))
    a.append_frame(torch.full((16,), 7)), b.append_frame(torch.full((16,), 1))
    again = table.slots_of([b, a])  # order changes nothing: rows are keyed by request
    assert torch.equal(again, slots.flip(0))
    assert table.rows(again)[1].nonzero().flatten().tolist() == [3, 5, 7]
    # A step whose output was dropped leaves the row behind the frames: it is rebuilt from them.
    table.mark(again, torch.tensor([9, 9]))
    assert table.rows(table.slots_of([a]))[0].nonzero().flatten().tolist() == [3, 5, 7]


def test_released_rows_are_reused_clean_and_a_full_table_says_so():
    table = SeenTable(num_rows=1, vocab_size=10, device=torch.device("cpu"))
    table.mark(table.slots_of([_seq("a", [2])]), torch.tensor([4]))
    with pytest.raises(SeenTableFull):
        table.slots_of([_seq("b", [])])
    table.release("a")
    assert not table.rows(table.slots_of([_seq("b", [])])).any()
