"""The scheduler's priority classes on the CPU: interactive admitted first when both wait, batch preempted first
(under `allow` and `fail`), arrival order kept within a class."""

from __future__ import annotations

import pytest

from services.engine.sequence import FailureCode, Sequence
from tests.unit.test_engine_scheduler import _admit, _plan, _run, _scheduler, _seq


def _batch(request_id: str, prompt_tokens: int, max_new_frames: int = 8) -> Sequence:
    seq = _seq(request_id, prompt_tokens, max_new_frames)
    seq.is_batch = True
    return seq


def test_interactive_requests_are_admitted_before_batch_ones_that_came_first() -> None:
    scheduler = _scheduler(blocks=16, max_num_seqs=2, max_num_batched_tokens=64)
    _admit(scheduler, _batch("b1", 4))
    _admit(scheduler, _batch("b2", 4))
    _admit(scheduler, _seq("i1", 4))
    _admit(scheduler, _seq("i2", 4))
    assert [s.request_id for s in scheduler.waiting] == ["i1", "i2", "b1", "b2"]
    out, _, _ = _run(scheduler)
    assert [request_id for request_id, _, _ in _plan(out)] == ["i1", "i2"]


def test_a_batch_request_waits_behind_interactive_ones_but_runs_when_they_leave() -> None:
    scheduler = _scheduler(blocks=16, max_num_seqs=1, max_num_batched_tokens=64)
    _admit(scheduler, _batch("b", 4, max_new_frames=2))
    _admit(scheduler, _seq("i", 4, max_new_frames=2))
    ran = []
    while scheduler.num_unfinished:
        out, _, _ = _run(scheduler)
        ran += [item.seq.request_id for item in out.scheduled]
    assert ran == ["i", "i", "b", "b"]  # starvation-free here: the batch request ran once the seat came free


def _pool_with_batch_first(mode: str):
    """A 5-block pool: a batch request (admitted first, 3 blocks) and a newer interactive one (2 blocks) fill it;
    the interactive request's next token does not fit."""
    scheduler = _scheduler(blocks=5, mode=mode, block_size=4)
    _admit(scheduler, _batch("b", 8, max_new_frames=6))
    out, _, _ = _run(scheduler)
    _admit(scheduler, _seq("i", 8, max_new_frames=6))
    out, _, _ = _run(scheduler)
    assert [request_id for request_id, _, _ in _plan(out)] == ["b", "i"]
    assert scheduler.block_manager.num_free_blocks == 0
    return scheduler


def test_allow_preempts_the_batch_request_even_when_the_interactive_one_is_newer() -> None:
    scheduler = _pool_with_batch_first("allow")
    out, _, outcomes = _run(scheduler)
    assert out.preempted_ids == ["b"] and outcomes == []
    assert [request_id for request_id, _, _ in _plan(out)] == ["i"]
    assert [s.request_id for s in scheduler.waiting] == ["b"]


def test_fail_ends_the_batch_request_first() -> None:
    scheduler = _pool_with_batch_first("fail")
    _, _, outcomes = _run(scheduler)
    assert [(o.request_id, o.code) for o in outcomes] == [("b", FailureCode.PREEMPTED)]
    assert scheduler.get("i") is not None


@pytest.mark.parametrize("mode", ["allow", "fail"])
def test_without_batch_requests_the_newest_interactive_one_is_still_the_victim(mode: str) -> None:
    scheduler = _scheduler(blocks=4, mode=mode, block_size=4)
    _admit(scheduler, _seq("a", 8, max_new_frames=6))
    _admit(scheduler, _seq("c", 8, max_new_frames=6))
    _run(scheduler)
    out, _, outcomes = _run(scheduler)
    assert (out.preempted_ids or [o.request_id for o in outcomes]) == ["c"]


def test_a_drain_keeps_each_class_in_arrival_order() -> None:
    scheduler = _scheduler(blocks=32, max_num_batched_tokens=64)
    for seq in (_batch("b1", 4), _seq("i1", 4), _batch("b2", 4), _seq("i2", 4)):
        _admit(scheduler, seq)
    _run(scheduler)
    with scheduler.drain():
        assert [s.request_id for s in scheduler.waiting] == ["i1", "i2", "b1", "b2"]
