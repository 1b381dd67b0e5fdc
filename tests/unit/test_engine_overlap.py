"""Overlapped steps: the host schedules and launches step N+1 before step N's codes are applied.

On the CPU the work of a launched step is done when `launch` returns, but the bookkeeping is the one the GPU runs
(frames pending while the next step is scheduled, decode inputs read from the device-side last frames, a frame
dropped when its request is preempted, aborted or ended at EOS meanwhile), so these tests prove it: the frames and
endings equal one-step-at-a-time runs for seeded requests, staggered arrivals, an abort in flight, and preemption in
both modes, and a wrong replay is still caught.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.config import EngineConfig, PreemptionMode
from services.engine.model_ops import replay_rows
from services.engine.outputs import ModelRunnerOutput
from services.engine.scheduler import Scheduler
from services.engine.sequence import FailureCode, Sequence, SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record, run_to_end
from tests.unit.test_engine_preemption import _mismatch, _run_until_first_event, _start, drop_codebooks_1_to_15, \
    shift_text_by_one

NUM_FRAMES = 9
SPEAKERS = ("ryan", "vivian", "eric", "ryan")


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


@dataclasses.dataclass
class _CallsRun(EngineRun):
    frames_by_call: list = dataclasses.field(default_factory=list)
    """Each `step()` call's own frames."""


def _staggered(tiny, overlap: bool, abort_at: int | None = None, overlap_min_rows: int = 0,
               late_launch: bool = False) -> tuple[EngineRun, int]:
    """Two requests, two more after three steps, request "3" aborted at step `abort_at`; run to the end."""
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, overlap_steps=overlap, overlap_min_rows=overlap_min_rows,
                        late_launch=late_launch)
    params = SamplingParams(temperature=0.9, top_k=50)

    def add(index: int) -> None:
        request = make_request(tokenizer, TEXTS[index], SPEAKERS[index])
        assert engine.add_request(EngineRequest(str(index), request, 1000 + index, params, NUM_FRAMES + index)) is None

    add(0), add(1)
    run = _CallsRun()
    aborted_frames = -1
    while engine.has_unfinished():
        if run.steps == 3:
            add(2), add(3)
        if run.steps == abort_at:
            outcome = engine.abort_request("3")
            assert outcome is not None and outcome.status is SequenceStatus.CANCELLED
            run.outcomes.append(outcome)
            aborted_frames = outcome.num_frames
        run.frames_by_call.append(record(run, engine).frames)
        assert run.steps < 200
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
    return run, aborted_frames


def test_overlapped_steps_give_the_frames_of_one_step_at_a_time(tiny) -> None:
    serial, _ = _staggered(tiny, overlap=False)
    overlapped, _ = _staggered(tiny, overlap=True)
    every_code = torch.cat([serial.stacked(request_id) for request_id in "0123"])
    assert len(set(every_code[:, 1].tolist())) > 5, "degenerate output proves nothing"
    for request_id in "0123":
        assert torch.equal(overlapped.stacked(request_id), serial.stacked(request_id)), request_id
        hidden_gap = (overlapped.hidden_of(request_id) - serial.hidden_of(request_id)).abs().max().item()
        assert hidden_gap < 1e-4
    ends = lambda run: sorted((o.request_id, o.status, o.num_frames) for o in run.outcomes)  # noqa: E731
    assert ends(overlapped) == ends(serial)
    assert {o.status for o in serial.outcomes} == {SequenceStatus.FINISHED_EOS, SequenceStatus.FINISHED_LENGTH}, \
        "both ends (an EOS drawn while the next step is in flight, and the frame budget) must be exercised"
    assert overlapped.steps == serial.steps + 1, "one more call: the last one only collects the step in flight"


def test_late_launched_steps_give_the_frames_of_overlapped_ones(tiny) -> None:
    """Queued late (`late_launch`), each step holds what it would have held queued early in this run (every request
    is added between calls), so the frames, endings and calls are the same, an abort in flight included."""
    early, early_aborted = _staggered(tiny, overlap=True, abort_at=5)
    late, late_aborted = _staggered(tiny, overlap=True, abort_at=5, late_launch=True)
    for request_id in "012":
        assert torch.equal(late.stacked(request_id), early.stacked(request_id)), request_id
    assert late_aborted == early_aborted and late.steps == early.steps
    ends = lambda run: sorted((o.request_id, o.status, o.num_frames) for o in run.outcomes)  # noqa: E731
    assert ends(late) == ends(early)


def test_a_step_returns_the_frames_of_the_step_before_it(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, overlap_steps=True)
    assert engine.add_request(EngineRequest("a", make_request(tokenizer, TEXTS[2]), 5, SamplingParams(), 2)) is None
    first = engine.step()  # the prefill is launched; nothing is applied yet
    assert first.frames == [] and first.outcomes == [] and engine.has_unfinished()
    second = engine.step()  # frame 1 launched, frame 0 applied
    assert [(f.request_id, f.index) for f in second.frames] == [("a", 0)] and second.outcomes == []
    third = engine.step()  # nothing left to launch (the last frame is in flight): collect it
    assert [(f.request_id, f.index) for f in third.frames] == [("a", 1)]
    assert [(o.request_id, o.status) for o in third.outcomes] == [("a", SequenceStatus.FINISHED_LENGTH)]
    assert not engine.has_unfinished()


def test_a_step_below_the_overlap_rows_returns_its_own_frames_and_a_larger_one_the_step_before(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, overlap_steps=True, overlap_min_rows=2)
    params = SamplingParams()
    assert engine.add_request(EngineRequest("a", make_request(tokenizer, TEXTS[2]), 5, params, 6)) is None
    alone = engine.step()  # one row: launched and read in the same call
    assert [(f.request_id, f.index) for f in alone.frames] == [("a", 0)]
    assert engine.add_request(EngineRequest("b", make_request(tokenizer, TEXTS[3]), 6, params, 6)) is None
    pair = engine.step()  # two rows: launched, and the call returns what the step before left (nothing in flight)
    assert pair.frames == []
    after = engine.step()  # the pair's frames come with the next launch
    assert sorted((f.request_id, f.index) for f in after.frames) == [("a", 1), ("b", 0)]


def test_steps_that_overlap_by_their_rows_give_the_frames_of_one_step_at_a_time(tiny) -> None:
    # Two rows, then four, then fewer as requests end: the calls switch between overlapped and not, both ways.
    serial, _ = _staggered(tiny, overlap=False)
    mixed, _ = _staggered(tiny, overlap=True, overlap_min_rows=3)
    for request_id in "0123":
        assert torch.equal(mixed.stacked(request_id), serial.stacked(request_id)), request_id
    ends = lambda run: sorted((o.request_id, o.status, o.num_frames) for o in run.outcomes)  # noqa: E731
    assert ends(mixed) == ends(serial)
    # Request 0 or 1 draws EOS at the third step. The late pair makes it three rows: that step overlaps, and its
    # call returns no frame (the step before it was read in its own call), where the serial engine returns its own
    # three. When the rows fall to two again, one call returns the step in flight and its own: five frames.
    serial_counts = [len(frames) for frames in serial.frames_by_call]
    mixed_counts = [len(frames) for frames in mixed.frames_by_call]
    assert serial_counts[:5] == [2, 2, 1, 3, 3] and mixed_counts[:5] == [2, 2, 1, 0, 3]
    assert 5 in mixed_counts and max(serial_counts) == 3


def test_an_abort_while_a_step_is_in_flight_drops_its_frame_and_leaves_the_others_alone(tiny) -> None:
    serial, _ = _staggered(tiny, overlap=False)
    overlapped, aborted_frames = _staggered(tiny, overlap=True, abort_at=8)
    got = overlapped.stacked("3")
    assert aborted_frames == len(got) >= 2
    assert torch.equal(got, serial.stacked("3")[:aborted_frames]), "what was returned is what an undisturbed run drew"
    for request_id in "012":
        assert torch.equal(overlapped.stacked(request_id), serial.stacked(request_id)), request_id
    assert [o.request_id for o in overlapped.outcomes].count("3") == 1


@pytest.mark.parametrize(
    ("layout", "replay", "faithful"),
    # In `tight` the victim's only frame is still in flight when it is preempted: dropped, so its replay is the
    # bare prompt and a wrong replay builder has nothing to get wrong; `slack` replays six frames.
    [("tight", replay_rows, True), ("slack", replay_rows, True), ("slack", drop_codebooks_1_to_15, False),
     ("slack", shift_text_by_one, False)],
    ids=["tight-faithful-replay", "slack-faithful-replay", "replay-drops-codebooks-1-15", "replay-shifts-text-by-one"],
)
def test_a_request_preempted_with_a_frame_in_flight_replays_faithfully(tiny, layout, replay, faithful) -> None:
    reference = run_to_end(_start(tiny, layout, "allow", roomy=True))
    engine = _start(tiny, layout, "allow", replay=replay, overlap=True)
    run = run_to_end(engine)
    assert run.preempted == ["b"]
    assert _mismatch(run, reference, "a") is None
    assert (_mismatch(run, reference, "b") is None) is faithful, _mismatch(run, reference, "b")
    assert [o.status for o in run.outcomes] == [SequenceStatus.FINISHED_LENGTH] * 2
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks


@pytest.mark.parametrize("layout", ["tight", "slack"])
def test_fail_mode_ends_a_victim_with_a_frame_in_flight_once_with_the_frames_it_returned(tiny, layout) -> None:
    reference = run_to_end(_start(tiny, layout, "fail", roomy=True))
    engine = _start(tiny, layout, "fail", overlap=True)
    run = _run_until_first_event(engine)
    run_to_end(engine, run)
    [failed] = [o for o in run.outcomes if o.request_id == "b"]
    returned = run.codes.get("b", [])  # in `tight` its only frame was in flight: dropped, none returned
    assert failed.code == FailureCode.PREEMPTED and failed.num_frames == len(returned)
    assert [o.request_id for o in run.outcomes].count("b") == 1
    if returned:
        assert torch.equal(torch.stack(returned), reference.stacked("b")[: failed.num_frames])
    assert _mismatch(run, reference, "a") is None
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks


# -- the scheduler's half, with a fake model whose frame k has every code equal to k --------------------------------

def _fake_output(scheduled, eos: set[str]) -> ModelRunnerOutput:
    sampling = [item.seq for item in scheduled if item.will_sample]
    codes = torch.tensor([[s.num_sampled_frames - 1] * 16 for s in sampling], dtype=torch.int64).reshape(-1, 16)
    return ModelRunnerOutput([s.request_id for s in sampling], codes, [s.request_id in eos for s in sampling])


def test_a_request_that_draws_eos_ran_one_token_for_nothing_and_ends_once() -> None:
    scheduler = Scheduler(EngineConfig(kv_cache_blocks=16, block_size=4), 16, PreemptionMode.ALLOW)
    for request_id in "ab":
        assert scheduler.add(Sequence(request_id, 3, seed=1, params=SamplingParams(), max_new_frames=8)) is None
    step_1 = scheduler.schedule()
    scheduler.launched(step_1.scheduled)
    output_1 = _fake_output(step_1.scheduled, eos=set())
    step_2 = scheduler.schedule()  # before step 1's codes: both decode on, their first frames pending
    assert [(i.seq.request_id, i.start, i.num_new_tokens) for i in step_2.scheduled] == [("a", 3, 1), ("b", 3, 1)]
    scheduler.launched(step_2.scheduled)
    output_2 = _fake_output(step_2.scheduled, eos={"a"})
    frames, outcomes = scheduler.update_from_output(step_1, output_1)
    assert [f.request_id for f in frames] == ["a", "b"] and outcomes == []
    step_3 = scheduler.schedule()  # "a" drew EOS in step 2, not known yet: it runs a token for nothing
    assert [i.seq.request_id for i in step_3.scheduled] == ["a", "b"]
    scheduler.launched(step_3.scheduled)
    frames, outcomes = scheduler.update_from_output(step_2, output_2)
    assert [(o.request_id, o.status) for o in outcomes] == [("a", SequenceStatus.FINISHED_EOS)]
    assert [(f.request_id, f.index) for f in frames] == [("b", 1)]
    frames, outcomes = scheduler.update_from_output(step_3, _fake_output(step_3.scheduled, eos=set()))
    assert [(f.request_id, f.index) for f in frames] == [("b", 2)] and outcomes == [], "a's extra frame is dropped"
    assert scheduler.get("a") is None and scheduler.get("b").num_pending_frames == 0


def test_a_request_whose_last_frame_is_in_flight_is_not_scheduled_again() -> None:
    scheduler = Scheduler(EngineConfig(kv_cache_blocks=16, block_size=4), 16, PreemptionMode.ALLOW)
    assert scheduler.add(Sequence("a", 3, seed=1, params=SamplingParams(), max_new_frames=2)) is None
    launched = []
    for _ in range(2):
        step = scheduler.schedule()
        scheduler.launched(step.scheduled)
        launched.append(step)
    assert scheduler.schedule().is_empty and scheduler.get("a").num_sampled_frames == 2
    ends = [scheduler.update_from_output(step, _fake_output(step.scheduled, set()))[1] for step in launched]
    assert ends[0] == [] and [(o.request_id, o.status, o.num_frames) for o in ends[1]] == [
        ("a", SequenceStatus.FINISHED_LENGTH, 2)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the overlap on the device needs CUDA")
def test_overlapped_graphed_steps_on_cuda_give_the_frames_of_one_step_at_a_time(tiny_checkpoint) -> None:
    from services.model.loader import load_model
    from services.model.text_tokenizer import TextTokenizer

    tiny_cuda = load_model(tiny_checkpoint, device=torch.device("cuda")), TextTokenizer.from_dir(tiny_checkpoint)
    serial, _ = _staggered(tiny_cuda, overlap=False)
    overlapped, aborted = _staggered(tiny_cuda, overlap=True, abort_at=8)
    for request_id in "012":
        assert torch.equal(overlapped.stacked(request_id), serial.stacked(request_id)), request_id
    assert torch.equal(overlapped.stacked("3"), serial.stacked("3")[:aborted])
