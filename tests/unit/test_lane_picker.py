"""Decode's choice of request lanes (services.bus.lane_picker) and its seats per priority (services.decode.capacity):
interactive first, the seats kept for it, batch never starved, the lanes of a priority in turn."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from messages import subjects
from messages.streams import request_lanes
from services.bus.lane_picker import LanePicker
from services.decode.capacity import EngineCapacity

MODEL = "tiny"
LANES = request_lanes(MODEL)


def _durable(priority: str, lane: int) -> str:
    return f"decode-{MODEL}-{priority}-{lane}"


def _picker() -> LanePicker:
    return LanePicker(LANES, subjects.PRIORITIES)


def _taken(plan) -> dict[str, int]:
    return {lane.durable: count for lane, count in plan}


def test_interactive_lanes_are_served_before_batch_ones() -> None:
    pending = {_durable("batch", 0): 50, _durable("interactive", 3): 2, "decode-tiny": 1}
    taken = _taken(_picker().plan(pending, {"interactive": 4, "batch": 4}))
    assert taken == {"decode-tiny": 1, _durable("interactive", 3): 2, _durable("batch", 0): 1}


def test_batch_takes_only_its_own_seats() -> None:
    pending = {_durable("batch", 0): 50}
    assert _taken(_picker().plan(pending, {"interactive": 4, "batch": 1})) == {_durable("batch", 0): 1}
    assert _picker().plan(pending, {"interactive": 4, "batch": 0}) == []


def test_interactive_leaves_its_floor_to_waiting_batch_work() -> None:
    pending = {_durable("interactive", 1): 50, _durable("batch", 2): 50}
    floors = {"interactive": 0, "batch": 1}
    taken = _taken(_picker().plan(pending, {"interactive": 4, "batch": 3}, floors))
    assert taken == {_durable("interactive", 1): 3, _durable("batch", 2): 1}
    # no batch work: interactive may take every seat
    alone = _taken(_picker().plan({_durable("interactive", 1): 50}, {"interactive": 4, "batch": 3}, floors))
    assert alone == {_durable("interactive", 1): 4}


def test_lanes_of_one_priority_take_turns_one_seat_at_a_time() -> None:
    """Two flooding tenants (lanes 2 and 5) and one free seat per round: they alternate, whatever their backlogs."""
    picker = _picker()
    pending = {_durable("batch", 2): 200, _durable("batch", 5): 3}
    served = Counter()
    for _ in range(6):
        [(lane, count)] = picker.plan(pending, {"interactive": 1, "batch": 1})
        served[lane.durable] += count
        pending[lane.durable] -= count
    assert served == {_durable("batch", 2): 3, _durable("batch", 5): 3}
    assert pending[_durable("batch", 5)] == 0
    [(lane, _)] = picker.plan(pending, {"interactive": 1, "batch": 1})
    assert lane.durable == _durable("batch", 2)  # the other lane emptied: no seat is kept idle for it


def test_a_round_with_several_seats_spreads_them_over_the_lanes() -> None:
    pending = {_durable("batch", 0): 10, _durable("batch", 4): 10, _durable("batch", 7): 1}
    taken = _taken(_picker().plan(pending, {"interactive": 6, "batch": 6}))
    assert taken == {_durable("batch", 0): 3, _durable("batch", 4): 2, _durable("batch", 7): 1}


class _Engine:
    def __init__(self, max_num_seqs: int) -> None:
        self.config = SimpleNamespace(max_num_seqs=max_num_seqs)

    def has_room(self) -> bool:
        return True


def test_seats_kept_for_interactive_work_and_the_batch_floor() -> None:
    capacity = EngineCapacity(_Engine(4), interactive_seats=1)
    for _ in range(3):
        capacity.take("batch")
    # batch holds every seat it may: the kept seat is still free for an interactive request
    assert capacity.room_for("batch") == 0 and capacity.room_for("interactive") == 1
    assert capacity.floor_for("batch") == 0
    capacity.take("interactive")
    assert capacity.room_for("interactive") == 0
    for _ in range(3):
        capacity.release("batch")
    assert capacity.floor_for("batch") == 1 and capacity.room_for("batch") == 3
    with pytest.raises(ValueError):
        EngineCapacity(_Engine(4), interactive_seats=4)  # batch needs a seat
