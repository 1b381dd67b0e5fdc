"""A prompt prefilled on one engine (a prefill replica) and continued on another (a decode replica) from its KV
blocks and first frame gives the codes of an undisturbed run: greedy and seeded, steps overlapped or not, with
other requests running beside it, and when the decode side preempts it and replays it locally. A KV of the wrong
shape is refused before anything is queued."""

from __future__ import annotations

import pytest
import torch

from services.engine.engine import InvalidRequestError
from services.engine.sequence import SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record, run_to_end

NUM_FRAMES = 12
SEED = 7
PARAMS = {"greedy": SamplingParams(temperature=0.0), "seeded": SamplingParams(temperature=0.9, top_k=20)}


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def prefilled(tiny, params: SamplingParams, overlap: bool, text: str = TEXTS[0]):
    """What a prefill replica hands over: the first frame and the prompt's KV blocks."""
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64, overlap_steps=overlap)
    assert engine.add_request(EngineRequest(
        "r", make_request(tokenizer, text), SEED, params, 1, exports_kv=True)) is None
    run = run_to_end(engine)
    [outcome] = run.outcomes
    assert outcome.status is SequenceStatus.FINISHED_LENGTH and outcome.prompt_kv is not None
    assert engine.stats().num_free_kv_blocks == engine.stats().num_kv_blocks, "its blocks are free once exported"
    return run.stacked("r"), outcome.prompt_kv


def hand_over(engine, run: EngineRun, tokenizer, params: SamplingParams, first, kv) -> EngineRun:
    """Request "r" joins `engine` with its prefilled KV and first frame (which the client already has)."""
    assert engine.add_request(EngineRequest(
        "r", make_request(tokenizer, TEXTS[0]), SEED, params, NUM_FRAMES, frames=first, prompt_kv=kv)) is None
    run.codes["r"] = list(first)
    run.hidden["r"] = [torch.zeros(0)]
    return run


def undisturbed(tiny, params: SamplingParams) -> torch.Tensor:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64)
    assert engine.add_request(EngineRequest("r", make_request(tokenizer, TEXTS[0]), SEED, params, NUM_FRAMES)) is None
    return run_to_end(engine).stacked("r")


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_a_handed_over_prompt_continues_as_an_undisturbed_run(tiny, kind, overlap):
    model, tokenizer = tiny
    params = PARAMS[kind]
    first, kv = prefilled(tiny, params, overlap)
    engine = new_engine(model, blocks=64, overlap_steps=overlap)
    # Another request is already running: the handed-over one joins a batch mid-way.
    assert engine.add_request(EngineRequest(
        "other", make_request(tokenizer, TEXTS[1], "vivian"), 3, params, NUM_FRAMES)) is None
    run = EngineRun()
    for _ in range(3):
        record(run, engine)
    run = run_to_end(engine, hand_over(engine, run, tokenizer, params, first, kv))
    assert torch.equal(run.stacked("r"), undisturbed(tiny, params))


def test_the_handed_over_request_computes_one_token_not_its_prompt(tiny):
    model, tokenizer = tiny
    first, kv = prefilled(tiny, PARAMS["greedy"], overlap=False)
    engine = new_engine(model, blocks=64, overlap_steps=False)
    assert engine.add_request(EngineRequest(
        "r", make_request(tokenizer, TEXTS[0]), SEED, PARAMS["greedy"], NUM_FRAMES, frames=first, prompt_kv=kv)) is None
    out = engine.step()
    assert out.num_batched_tokens == 1
    assert [frame.index for frame in out.frames] == [1]


def test_a_preempted_handed_over_request_replays_locally_and_faithfully(tiny):
    model, tokenizer = tiny
    params = PARAMS["seeded"]
    first, kv = prefilled(tiny, params, overlap=False)
    prompt_blocks = kv.shape[0]
    # Room for the handed request alone to its end, not beside the older one: the newer (handed) one is preempted.
    engine = new_engine(model, blocks=prompt_blocks + 7, overlap_steps=False)
    assert engine.add_request(EngineRequest(
        "older", make_request(tokenizer, TEXTS[2], "vivian"), 3, params, NUM_FRAMES)) is None
    run = EngineRun()
    record(run, engine)
    run = run_to_end(engine, hand_over(engine, run, tokenizer, params, first, kv))
    assert "r" in run.preempted, "the pool was meant to be too small for both"
    assert torch.equal(run.stacked("r"), undisturbed(tiny, params))


def test_a_kv_of_the_wrong_shape_is_refused(tiny):
    model, tokenizer = tiny
    first, kv = prefilled(tiny, PARAMS["greedy"], overlap=False)
    engine = new_engine(model, blocks=64)
    for wrong in (kv[:-1], kv.to(torch.float64), kv[:, :, :1]):
        with pytest.raises(InvalidRequestError, match="prompt_kv"):
            engine.add_request(EngineRequest(
                "r", make_request(tokenizer, TEXTS[0]), SEED, PARAMS["greedy"], NUM_FRAMES, frames=first,
                prompt_kv=wrong))
    with pytest.raises(InvalidRequestError, match="frames"):
        engine.add_request(EngineRequest(
            "r", make_request(tokenizer, TEXTS[0]), SEED, PARAMS["greedy"], NUM_FRAMES, prompt_kv=kv))
    assert not engine.has_unfinished()
