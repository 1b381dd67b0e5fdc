"""The scheduler on the CPU with hand-built runner outputs: batching, limits, preemption, capacity, drain."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig, PreemptionMode
from services.engine.errors import DuplicateRequestError
from services.engine.outputs import ModelRunnerOutput, SchedulerOutput
from services.engine.scheduler import Scheduler
from services.engine.sequence import FailureCode, Sequence, SequenceStatus
from services.model.sampling import SamplingParams


def _seq(request_id: str, prompt_tokens: int, max_new_frames: int = 8) -> Sequence:
    return Sequence(request_id, prompt_tokens, seed=7, params=SamplingParams(), max_new_frames=max_new_frames)


def _admit(scheduler: Scheduler, seq: Sequence) -> None:
    assert scheduler.add(seq) is None, f"{seq.request_id} was refused"


def _scheduler(blocks: int, mode: str = "allow", block_size: int = 4, **kwargs) -> Scheduler:
    config = EngineConfig(kv_cache_blocks=blocks, block_size=block_size, **kwargs)
    return Scheduler(config, blocks, PreemptionMode(mode))


def _run(scheduler: Scheduler, eos: set[str] = frozenset()) -> tuple[SchedulerOutput, list, list]:
    """One step with a fake model: frame k of a request has all codes equal to k."""
    out = scheduler.schedule()
    sampling = [item.seq for item in out.scheduled if item.will_sample]
    codes = torch.tensor([[s.num_frames] * 16 for s in sampling], dtype=torch.int64).reshape(-1, 16)
    runner = ModelRunnerOutput([s.request_id for s in sampling], codes, [s.request_id in eos for s in sampling])
    scheduler.launched(out.scheduled)
    frames, outcomes = scheduler.update_from_output(out, runner)
    return out, frames, out.outcomes + outcomes


def _plan(out: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(item.seq.request_id, item.start, item.num_new_tokens) for item in out.scheduled]


def test_requests_join_and_leave_every_step() -> None:
    scheduler = _scheduler(blocks=16)
    _admit(scheduler, _seq("a", 5))
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 0, 5)] and [f.request_id for f in frames] == ["a"]
    _admit(scheduler, _seq("b", 3))
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 5, 1), ("b", 0, 3)]
    assert [(f.request_id, f.index) for f in frames] == [("a", 1), ("b", 0)]
    out, _, outcomes = _run(scheduler, eos={"a"})
    assert [(o.request_id, o.status) for o in outcomes] == [("a", SequenceStatus.FINISHED_EOS)]
    assert scheduler.block_manager.num_free_blocks == 16 - 1  # b: 4 tokens in one block
    out, _, _ = _run(scheduler)
    assert _plan(out) == [("b", 4, 1)]


def test_prefills_are_batched_and_chunked_under_the_token_budget() -> None:
    scheduler = _scheduler(blocks=32, max_num_seqs=4, max_num_batched_tokens=16)
    for name in "abc":
        _admit(scheduler, _seq(name, 10))
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 0, 10), ("b", 0, 6)]
    assert [f.request_id for f in frames] == ["a"]  # b's chunk does not complete its prompt
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 10, 1), ("b", 6, 4), ("c", 0, 10)]
    assert [f.request_id for f in frames] == ["a", "b", "c"]
    assert out.num_batched_tokens == 15


def test_max_num_seqs_bounds_the_running_set() -> None:
    scheduler = _scheduler(blocks=32, max_num_seqs=2, max_num_batched_tokens=64)
    for name in "abc":
        _admit(scheduler, _seq(name, 3))
    out, _, _ = _run(scheduler)
    assert [item.seq.request_id for item in out.scheduled] == ["a", "b"]
    assert not scheduler.has_room()
    _, _, outcomes = _run(scheduler, eos={"a"})
    out, _, _ = _run(scheduler)
    assert [item.seq.request_id for item in out.scheduled] == ["b", "c"]


def _exhausted_pool(mode: str) -> Scheduler:
    """Two 8-token prompts fill an 4-block pool exactly: both prefill, neither fits its next decode token."""
    scheduler = _scheduler(blocks=4, mode=mode, block_size=4)
    _admit(scheduler, _seq("a", 8, max_new_frames=6))
    _admit(scheduler, _seq("b", 8, max_new_frames=6))
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 0, 8), ("b", 0, 8)] and scheduler.block_manager.num_free_blocks == 0
    return scheduler


def test_allow_requeues_the_newest_request_and_replays_it_from_its_frames() -> None:
    scheduler = _exhausted_pool("allow")
    out, frames, outcomes = _run(scheduler)
    assert out.preempted_ids == ["b"] and outcomes == []
    assert _plan(out) == [("a", 8, 1)] and [f.request_id for f in frames] == ["a"]
    victim = scheduler.get("b")
    assert victim.status == SequenceStatus.PREEMPTED and victim.block_table == []
    assert list(scheduler.waiting) == [victim] and victim.num_frames == 1 and victim.num_computed_tokens == 0
    assert scheduler.block_manager.num_free_blocks == 4 - 3
    while scheduler.get("a") is not None:
        out, _, outcomes = _run(scheduler)
        assert "b" not in [item.seq.request_id for item in out.scheduled]
    assert [o.status for o in outcomes] == [SequenceStatus.FINISHED_LENGTH]
    out, frames, _ = _run(scheduler)
    # The replay prefills the prompt and the one stored frame, then samples frame 1.
    assert _plan(out) == [("b", 0, 9)] and [(f.request_id, f.index) for f in frames] == [("b", 1)]
    assert victim.text_position == 1 and victim.frames[:, 0].tolist() == [0, 1]


def test_fail_ends_the_victim_once_frees_its_blocks_and_never_requeues_it() -> None:
    scheduler = _exhausted_pool("fail")
    out, frames, outcomes = _run(scheduler)
    assert [(o.request_id, o.code, o.num_frames) for o in outcomes] == [("b", FailureCode.PREEMPTED, 1)]
    assert "truncated" in outcomes[0].reason and "--kv-cache-blocks" in outcomes[0].reason
    assert out.preempted_ids == [] and not scheduler.waiting and scheduler.get("b") is None
    assert scheduler.block_manager.num_free_blocks == 4 - 3
    survivor_frames = [f.index for f in frames]
    while scheduler.get("a") is not None:
        out, frames, outcomes = _run(scheduler)
        assert all(o.request_id == "a" for o in outcomes) and _plan(out)[0][0] == "a" and len(out.scheduled) == 1
        survivor_frames += [f.index for f in frames]
    assert survivor_frames == [1, 2, 3, 4, 5] and outcomes[0].status == SequenceStatus.FINISHED_LENGTH
    assert scheduler.block_manager.num_free_blocks == 4


def test_a_request_too_big_for_the_whole_pool_fails_with_capacity_at_once() -> None:
    scheduler = _scheduler(blocks=4, block_size=4)
    outcome = scheduler.add(_seq("huge", 20))
    assert outcome.code == FailureCode.CAPACITY and "pool has 4" in outcome.reason
    assert scheduler.num_unfinished == 0 and scheduler.block_manager.num_free_blocks == 4
    # Its worst case (prompt + frame budget) must fit too: 10 + 8 - 1 tokens need 5 blocks.
    assert scheduler.add(_seq("long", 10, max_new_frames=8)).code == FailureCode.CAPACITY
    assert scheduler.add(_seq("fits", 10, max_new_frames=7)) is None


def test_max_model_len_caps_the_frame_budget() -> None:
    scheduler = _scheduler(blocks=16, max_model_len=12)
    assert scheduler.add(_seq("x", 13)).code == FailureCode.CAPACITY
    _admit(scheduler, _seq("a", 10, max_new_frames=100))
    frames = []
    while scheduler.get("a") is not None:
        _, new, outcomes = _run(scheduler)
        frames += new
    assert len(frames) == 3 and outcomes[0].status == SequenceStatus.FINISHED_LENGTH


def test_abort_frees_blocks_at_once() -> None:
    scheduler = _scheduler(blocks=8)
    _admit(scheduler, _seq("a", 6))
    _admit(scheduler, _seq("b", 6))
    _run(scheduler)
    _admit(scheduler, _seq("c", 6))
    assert scheduler.abort("a").status == SequenceStatus.CANCELLED
    assert scheduler.abort("c").status == SequenceStatus.CANCELLED
    assert scheduler.abort("a") is None and scheduler.abort("nope") is None
    assert scheduler.block_manager.num_free_blocks == 8 - 2
    with pytest.raises(DuplicateRequestError):
        scheduler.add(_seq("b", 3))


def test_drain_in_allow_mode_pauses_then_resumes_by_replay() -> None:
    scheduler = _scheduler(blocks=16)
    _admit(scheduler, _seq("a", 5))
    _admit(scheduler, _seq("b", 5))
    _run(scheduler)
    _run(scheduler)
    with scheduler.drain() as ended:
        assert ended == [] and scheduler.block_manager.num_free_blocks == 16
        assert [s.request_id for s in scheduler.waiting] == ["a", "b"]
        assert scheduler.schedule().is_empty and not scheduler.has_room()
    out, frames, _ = _run(scheduler)
    assert _plan(out) == [("a", 0, 7), ("b", 0, 7)] and [f.index for f in frames] == [2, 2]


def test_drain_in_fail_mode_ends_running_requests_drained() -> None:
    scheduler = _scheduler(blocks=16, mode="fail")
    _admit(scheduler, _seq("a", 5))
    _run(scheduler)
    _admit(scheduler, _seq("b", 5))
    with scheduler.drain() as ended:
        assert [(o.request_id, o.code) for o in ended] == [("a", FailureCode.DRAINED)]
        assert "truncated" in ended[0].reason
    assert scheduler.block_manager.num_free_blocks == 16
    out, _, _ = _run(scheduler)
    assert _plan(out) == [("b", 0, 5)]


def test_drain_scope_is_cleared_when_the_drain_raises() -> None:
    scheduler = _scheduler(blocks=16)
    _admit(scheduler, _seq("a", 5))
    _run(scheduler)
    with pytest.raises(RuntimeError, match="reload failed"):
        with scheduler.drain():
            raise RuntimeError("reload failed")
    assert not scheduler.is_draining
    out, _, _ = _run(scheduler)
    assert _plan(out) == [("a", 0, 6)]
