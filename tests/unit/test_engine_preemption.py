"""Preemption through the real scheduler and a genuinely exhausted pool, in both modes (DESIGN.md).

Two requests with equal-length prompts fill the pool exactly at prefill. With the `tight` layout the
very next decode step needs a new block for each; with `slack` each prompt's block has 6 spare
tokens, so the victim has emitted 7 frames when the pool runs dry. Only one request can continue.
"""

from __future__ import annotations

import pytest
import torch

from services.engine.model_ops import make_prompt, replay_rows
from services.engine.sequence import FailureCode, SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.loader import TTSModel
from services.model.prompt import Prompt
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record, run_to_end

HIDDEN_TOLERANCE = 1e-4
FRAMES_AT_PREEMPTION = {"tight": 1, "slack": 7}


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def drop_codebooks_1_to_15(model: TTSModel, prompt: Prompt, frames: torch.Tensor) -> torch.Tensor:
    """A wrong replay: each frame's input keeps codebook 0 and the text, but loses codebooks 1-15."""
    positions = torch.arange(frames.shape[0])
    return torch.cat((prompt.embeds, model.talker.codec_embedding(frames[:, 0]) + prompt.trailing_rows(positions)))


def shift_text_by_one(model: TTSModel, prompt: Prompt, frames: torch.Tensor) -> torch.Tensor:
    """A wrong replay: full frames, but each frame's text row is the next one."""
    positions = torch.arange(frames.shape[0]) + 1
    return torch.cat((prompt.embeds, model.talker.embed_codes(frames) + prompt.trailing_rows(positions)))


def _start(tiny, layout: str, mode: str, roomy: bool = False, replay=replay_rows, overlap: bool = False):
    """Two streaming-text requests in an engine whose pool is exhausted right after their prefills.
    `overlap`: the engine prepares each step while the one before it runs (test_engine_overlap.py)."""
    model, tokenizer = tiny
    requests = {"a": make_request(tokenizer, TEXTS[0], "ryan"), "b": make_request(tokenizer, TEXTS[3], "vivian")}
    lengths = {make_prompt(model, r).embeds.shape[0] for r in requests.values()}
    assert len(lengths) == 1, "the scenario needs equal prompt lengths"
    length = lengths.pop()
    if layout == "tight":
        block_size = next((d for d in (5, 4, 3, 2) if length % d == 0), length)
        num_frames = length  # prompt + frames - 1 tokens still fit the whole pool alone
    else:
        block_size = length + FRAMES_AT_PREEMPTION["slack"] - 1
        num_frames = length + 4
    pool = 256 if roomy else 2 * length // block_size if layout == "tight" else 2
    engine = new_engine(model, blocks=pool, block_size=block_size, mode=mode, replay=replay, overlap_steps=overlap)
    for seed, (request_id, request) in enumerate(requests.items()):
        assert engine.add_request(EngineRequest(request_id, request, 100 + seed, SamplingParams(), num_frames)) is None
    return engine


def _mismatch(run: EngineRun, reference: EngineRun, request_id: str) -> str | None:
    """Why `run`'s frames of a request differ from the undisturbed run's (None: faithful)."""
    got, want = run.stacked(request_id), reference.stacked(request_id)
    if got.shape != want.shape or not torch.equal(got, want):
        return "codes differ"
    gap = (run.hidden_of(request_id) - reference.hidden_of(request_id)).abs().max().item()
    return f"hidden states differ by {gap:.2e}" if gap > HIDDEN_TOLERANCE else None


def _run_until_first_event(engine) -> EngineRun:
    run = EngineRun()
    record(run, engine)
    assert engine.scheduler.block_manager.num_free_blocks == 0, "both prompts fill the pool"
    while not run.preempted and not run.outcomes:
        record(run, engine)
        assert run.steps < 50
    return run


@pytest.mark.parametrize("layout", ["tight", "slack"])
@pytest.mark.parametrize(
    ("replay", "faithful"),
    [(replay_rows, True), (drop_codebooks_1_to_15, False), (shift_text_by_one, False)],
    ids=["faithful-replay", "replay-drops-codebooks-1-15", "replay-shifts-text-by-one"],
)
def test_allow_resumes_the_victim_exactly_and_a_wrong_replay_is_caught(tiny, layout, replay, faithful) -> None:
    reference = run_to_end(_start(tiny, layout, "allow", roomy=True))
    engine = _start(tiny, layout, "allow", replay=replay)
    run = _run_until_first_event(engine)
    assert run.preempted == ["b"] and run.outcomes == []
    assert len(run.codes["b"]) == FRAMES_AT_PREEMPTION[layout]
    run_to_end(engine, run)
    assert run.preempted == ["b"], "exactly one preemption: the victim waits until it fits"
    assert _mismatch(run, reference, "a") is None, "the survivor is untouched"
    assert (_mismatch(run, reference, "b") is None) is faithful, _mismatch(run, reference, "b")
    assert [o.status for o in run.outcomes] == [SequenceStatus.FINISHED_LENGTH] * 2
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks


@pytest.mark.parametrize("layout", ["tight", "slack"])
def test_fail_ends_the_victim_once_and_the_survivor_finishes(tiny, layout) -> None:
    reference = run_to_end(_start(tiny, layout, "fail", roomy=True))
    engine = _start(tiny, layout, "fail")
    run = _run_until_first_event(engine)
    [failed] = run.outcomes
    assert (failed.request_id, failed.status, failed.code) == ("b", SequenceStatus.FAILED, FailureCode.PREEMPTED)
    assert "truncated" in failed.reason and "--max-num-seqs" in failed.reason
    assert failed.num_frames == len(run.codes["b"]) == FRAMES_AT_PREEMPTION[layout]
    assert run.preempted == [] and not engine.scheduler.waiting and engine.scheduler.get("b") is None
    survivor = engine.scheduler.get("a")
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks - len(survivor.block_table)
    clean = record(run, engine)
    assert clean.outcomes == [] and clean.preempted_ids == [] and [f.request_id for f in clean.frames] == ["a"]
    run_to_end(engine, run)
    assert [(o.request_id, o.status) for o in run.outcomes] == [
        ("b", SequenceStatus.FAILED), ("a", SequenceStatus.FINISHED_LENGTH)]
    assert _mismatch(run, reference, "a") is None
    assert torch.equal(run.stacked("b"), reference.stacked("b")[: failed.num_frames])
    assert engine.scheduler.block_manager.num_free_blocks == engine.num_blocks
