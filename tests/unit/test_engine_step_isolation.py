"""A step that raises because of one request fails that request alone; the others go on as if undisturbed.

The fault is injected around the real runner's `launch`, after the step has run (its KV writes, its
repetition-penalty marks, its sampled frames): the re-runs must be safe against all of them.
"""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.sequence import FailureCode, SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, load_tiny, make_request, new_engine, run_to_end

NUM_FRAMES = 10
POISON = "poison"
IDS = ("a", "b", POISON, "c", "d")
FAILS_FROM_FRAME = 3


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _engine_with_requests(tiny):
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, block_size=4)
    for index, request_id in enumerate(IDS):
        request = make_request(tokenizer, TEXTS[index % len(TEXTS)], ("ryan", "vivian", "eric")[index % 3])
        assert engine.add_request(EngineRequest(request_id, request, 40 + index, SamplingParams(), NUM_FRAMES)) is None
    return engine


class PoisonedLaunch:
    """Wraps the runner's launch: runs the whole step, then raises if the poison request is in it past a frame."""

    def __init__(self, launch) -> None:
        self.launch = launch
        self.batches: list[list[str]] = []

    def __call__(self, scheduled):
        launched = self.launch(scheduled)
        launched.result()  # every side effect of the step happens before the fault
        ids = [item.seq.request_id for item in scheduled]
        self.batches.append(ids)
        if any(item.seq.request_id == POISON and item.seq.num_frames >= FAILS_FROM_FRAME for item in scheduled):
            raise RuntimeError("poisoned request")
        return launched


def test_the_request_that_fails_a_step_fails_alone_and_the_others_equal_an_undisturbed_run(tiny) -> None:
    undisturbed = run_to_end(_engine_with_requests(tiny))
    engine = _engine_with_requests(tiny)
    poisoned = PoisonedLaunch(engine.runner.launch)
    engine.runner.launch = poisoned
    run = run_to_end(engine)
    [failed] = [outcome for outcome in run.outcomes if outcome.is_failed]
    assert failed.request_id == POISON and failed.code == FailureCode.STEP_FAILED
    assert "poisoned request" in failed.reason and failed.num_frames == FAILS_FROM_FRAME
    assert len(run.codes[POISON]) == FAILS_FROM_FRAME
    for request_id in IDS:
        if request_id == POISON:
            continue
        assert len(set(undisturbed.stacked(request_id)[:, 0].tolist())) > 3, "degenerate output proves nothing"
        assert torch.equal(run.stacked(request_id), undisturbed.stacked(request_id)), request_id
    assert sorted(o.request_id for o in run.outcomes) == sorted(IDS)
    assert all(o.status == SequenceStatus.FINISHED_LENGTH for o in run.outcomes if o.request_id != POISON)
    # The failing step: the whole batch, then at most log2(batch) + 1 re-runs, the last without the poison.
    first_failure = next(i for i, ids in enumerate(poisoned.batches) if POISON in ids and len(ids) == len(IDS)
                         and i >= FAILS_FROM_FRAME)
    survivors = [rid for rid in IDS if rid != POISON]
    num_reruns = poisoned.batches.index(survivors, first_failure + 1) - first_failure
    assert 1 <= num_reruns <= math.ceil(math.log2(len(IDS))) + 1
    assert all(len(ids) < len(IDS) for ids in poisoned.batches[first_failure + 1 : first_failure + num_reruns])
    assert all(POISON not in ids for ids in poisoned.batches[first_failure + num_reruns :])
    assert engine.scheduler.block_manager.num_free_blocks == 96 and not engine.has_unfinished()


def test_a_step_that_fails_whatever_runs_fails_its_requests_after_a_bounded_number_of_reruns(tiny) -> None:
    engine = _engine_with_requests(tiny)
    calls: list[int] = []

    def lost_device(scheduled):
        calls.append(len(scheduled))
        raise RuntimeError("device lost")

    engine.runner.launch = lost_device
    out = engine.step()
    assert sorted(o.request_id for o in out.outcomes) == sorted(IDS) and not out.frames
    assert all(o.code == FailureCode.STEP_FAILED and "device lost" in o.reason for o in out.outcomes)
    assert calls[0] == len(IDS) and len(calls) - 1 <= math.ceil(math.log2(len(IDS))) + 1
    assert not engine.has_unfinished() and engine.scheduler.block_manager.num_free_blocks == 96
