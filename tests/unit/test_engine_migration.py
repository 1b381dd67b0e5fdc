"""A request added with frames it already emitted elsewhere (a migration from a dead decode replica) continues
exactly as an undisturbed run: its first prefill replays prompt + frames the way a preemption's does, inside a
batch that is already running another request. A wrong replay (codebooks 1-15 dropped, text shifted by one) is
caught by the same comparison."""

from __future__ import annotations

import pytest
import torch

from services.engine.model_ops import replay_rows
from services.engine.sequence import SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record, run_to_end
from tests.unit.test_engine_preemption import drop_codebooks_1_to_15, shift_text_by_one  # the same wrong replays

HIDDEN_TOLERANCE = 1e-4
NUM_FRAMES = 16
FRAMES_BEFORE_DEATH = 7
PARAMS = SamplingParams(temperature=0.9, top_k=20)
SEEDS = {"migrated": 41, "resident": 42}


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _requests(tokenizer):
    return {"migrated": make_request(tokenizer, TEXTS[0], "ryan"),
            "resident": make_request(tokenizer, TEXTS[1], "vivian")}


def _undisturbed(tiny) -> EngineRun:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64)
    for request_id, request in _requests(tokenizer).items():
        assert engine.add_request(EngineRequest(request_id, request, SEEDS[request_id], PARAMS, NUM_FRAMES)) is None
    return run_to_end(engine)


def _migrated(tiny, replay, emitted: torch.Tensor) -> EngineRun:
    """A second engine (the taking-over replica): `resident` runs a few steps, then `migrated` joins with the frames
    its dead replica had emitted."""
    model, tokenizer = tiny
    requests = _requests(tokenizer)
    engine = new_engine(model, blocks=64, replay=replay)
    assert engine.add_request(EngineRequest(
        "resident", requests["resident"], SEEDS["resident"], PARAMS, NUM_FRAMES)) is None
    run = EngineRun()
    for _ in range(3):
        record(run, engine)
    assert engine.add_request(EngineRequest(
        "migrated", requests["migrated"], SEEDS["migrated"], PARAMS, NUM_FRAMES, frames=emitted)) is None
    run.codes["migrated"] = list(emitted)  # what the client already has; the engine returns only what follows
    run.hidden["migrated"] = [torch.zeros(0)] * len(emitted)
    return run_to_end(engine, run)


def _differs(run: EngineRun, reference: EngineRun, request_id: str, first: int = 0) -> str | None:
    got, want = run.stacked(request_id), reference.stacked(request_id)
    if got.shape != want.shape or not torch.equal(got, want):
        return "codes differ"
    gap = (torch.stack(run.hidden[request_id][first:]) - torch.stack(reference.hidden[request_id][first:])).abs().max()
    return f"hidden states differ by {gap.item():.2e}" if gap > HIDDEN_TOLERANCE else None


@pytest.mark.parametrize(
    ("replay", "faithful"),
    [(replay_rows, True), (drop_codebooks_1_to_15, False), (shift_text_by_one, False)],
    ids=["faithful-replay", "replay-drops-codebooks-1-15", "replay-shifts-text-by-one"],
)
def test_a_migrated_request_continues_exactly_and_a_wrong_replay_is_caught(tiny, replay, faithful) -> None:
    reference = _undisturbed(tiny)
    emitted = reference.stacked("migrated")[:FRAMES_BEFORE_DEATH]
    run = _migrated(tiny, replay, emitted)
    assert _differs(run, reference, "resident") is None, "the request already running is untouched"
    mismatch = _differs(run, reference, "migrated", first=FRAMES_BEFORE_DEATH)
    assert (mismatch is None) is faithful, mismatch
    assert not run.preempted
    if faithful:
        assert sorted((o.request_id, o.status) for o in run.outcomes) == [
            ("migrated", SequenceStatus.FINISHED_LENGTH), ("resident", SequenceStatus.FINISHED_LENGTH)]


def test_a_migrated_request_whose_frames_reach_its_budget_ends_at_once(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64)
    frames = torch.zeros((NUM_FRAMES, 16), dtype=torch.int64)
    outcome = engine.add_request(EngineRequest(
        "done", _requests(tokenizer)["migrated"], 1, PARAMS, NUM_FRAMES, frames=frames))
    assert outcome is not None and (outcome.status, outcome.num_frames) == (SequenceStatus.FINISHED_LENGTH, NUM_FRAMES)
    assert not engine.has_unfinished()
