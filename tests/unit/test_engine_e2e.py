"""The engine with the tiny model: batched runs equal single-request generation; capacity, abort, drain."""

from __future__ import annotations

import pytest
import torch

from services.engine.engine import InvalidRequestError
from services.engine.sequence import FailureCode, SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.errors import RequestError
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, oracle_codes, record, run_to_end

NUM_FRAMES = 12


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _mixed_requests(tokenizer):
    requests = [
        make_request(tokenizer, TEXTS[0], "ryan", "english", streaming=True),
        make_request(tokenizer, TEXTS[1], "vivian", "auto", streaming=False),
        make_request(tokenizer, TEXTS[2], None, "chinese", streaming=True),
        make_request(tokenizer, TEXTS[3], "eric", "chinese", streaming=True),
    ]
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.0),
        SamplingParams(),
        SamplingParams(temperature=1.2, top_k=0, top_p=0.8, repetition_penalty=1.3),
        SamplingParams(temperature=0.7, top_k=5),
    ]
    # The code predictor may sample differently from the talker (the checkpoint's subtalker_* settings).
    predictor = [None, SamplingParams(temperature=0.0, repetition_penalty=1.0), None,
                 SamplingParams(temperature=1.0, top_k=20, repetition_penalty=1.0)]
    seeds = [11, 22, 33, 2**63 + 9]
    return requests, params, predictor, seeds


def test_staggered_batch_equals_single_request_generation(tiny) -> None:
    model, tokenizer = tiny
    requests, params, predictor, seeds = _mixed_requests(tokenizer)
    expected = [oracle_codes(model, *args, NUM_FRAMES, pp) for *args, pp in zip(requests, params, seeds, predictor)]
    budget = 24
    assert len(requests[1].text_ids) > budget  # request 1's prompt is prefilled in chunks
    engine = new_engine(model, blocks=64, block_size=4, max_num_batched_tokens=budget)
    arrivals = {0: [0], 1: [1], 3: [2], 4: [3]}
    run = EngineRun()
    while run.steps < 5 or engine.has_unfinished():
        for index in arrivals.get(run.steps, []):
            outcome = engine.add_request(EngineRequest(
                str(index), requests[index], seeds[index], params[index], NUM_FRAMES, predictor[index]))
            assert outcome is None
        record(run, engine)
    for index, codes in enumerate(expected):
        assert len(set(codes[:, 0].tolist())) > 3, "degenerate oracle output proves nothing"
        assert torch.equal(run.stacked(str(index)), codes), f"request {index}"
    assert sorted(o.request_id for o in run.outcomes) == ["0", "1", "2", "3"]
    assert engine.scheduler.block_manager.num_free_blocks == 64


def test_a_request_too_big_for_the_pool_fails_with_capacity_at_once(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=4, block_size=4)
    request = make_request(tokenizer, TEXTS[0])
    outcome = engine.add_request(EngineRequest("big", request, 1, SamplingParams(), max_new_frames=40))
    assert outcome.status == SequenceStatus.FAILED and outcome.code == FailureCode.CAPACITY
    assert "--kv-cache-blocks" in outcome.reason and not engine.has_unfinished()
    assert engine.add_request(EngineRequest("small", request, 1, SamplingParams(), max_new_frames=3)) is None
    run = run_to_end(engine)
    assert len(run.codes["small"]) == 3 and engine.scheduler.block_manager.num_free_blocks == 4


def test_abort_frees_blocks_and_the_others_continue(tiny) -> None:
    model, tokenizer = tiny
    request = make_request(tokenizer, TEXTS[0])
    engine = new_engine(model, blocks=32)
    engine.add_request(EngineRequest("a", request, 1, SamplingParams(), NUM_FRAMES))
    engine.add_request(EngineRequest("b", request, 2, SamplingParams(), NUM_FRAMES))
    run = EngineRun()
    record(run, engine)
    held_by_a = len(engine.scheduler.get("a").block_table)
    free_before = engine.scheduler.block_manager.num_free_blocks
    outcome = engine.abort_request("a")
    assert outcome.status == SequenceStatus.CANCELLED and outcome.num_frames == 1
    assert engine.scheduler.block_manager.num_free_blocks == free_before + held_by_a
    assert engine.abort_request("a") is None
    run_to_end(engine, run)
    assert len(run.codes["a"]) == 1 and len(run.codes["b"]) == NUM_FRAMES


def _two_requests(engine, tokenizer) -> None:
    engine.add_request(EngineRequest("a", make_request(tokenizer, TEXTS[0], "ryan"), 5, SamplingParams(), NUM_FRAMES))
    engine.add_request(EngineRequest("b", make_request(tokenizer, TEXTS[3], "vivian"), 6, SamplingParams(), NUM_FRAMES))


def test_drain_in_allow_mode_resumes_faithfully_even_when_the_drain_raises(tiny) -> None:
    model, tokenizer = tiny
    reference = new_engine(model, blocks=64)
    _two_requests(reference, tokenizer)
    expected = run_to_end(reference)
    engine = new_engine(model, blocks=64)
    _two_requests(engine, tokenizer)
    run = EngineRun()
    for _ in range(4):
        record(run, engine)
    with pytest.raises(RuntimeError, match="weight reload failed"):
        with engine.drain() as ended:
            assert ended == [] and engine.scheduler.block_manager.num_free_blocks == 64
            idle = engine.step()
            assert idle.frames == [] and idle.num_batched_tokens == 0
            raise RuntimeError("weight reload failed")
    assert not engine.scheduler.is_draining
    run_to_end(engine, run)
    for request_id in "ab":
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id))
        assert torch.allclose(run.hidden_of(request_id), expected.hidden_of(request_id), atol=1e-4, rtol=0)


def test_drain_in_fail_mode_ends_running_requests_drained(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64, mode="fail")
    _two_requests(engine, tokenizer)
    run = EngineRun()
    record(run, engine)
    with engine.drain() as ended:
        assert [(o.request_id, o.code) for o in ended] == [("a", FailureCode.DRAINED), ("b", FailureCode.DRAINED)]
        assert all("truncated" in o.reason for o in ended)
    assert not engine.has_unfinished() and engine.scheduler.block_manager.num_free_blocks == 64
    engine.add_request(EngineRequest("c", make_request(tokenizer, TEXTS[2]), 7, SamplingParams(), 3))
    assert len(run_to_end(engine, run).codes["c"]) == 3


def test_bad_requests_are_refused_with_typed_errors(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=16)
    with pytest.raises(RequestError) as info:
        engine.add_request(EngineRequest(
            "x", make_request(tokenizer, TEXTS[0], speaker="nobody"), 1, SamplingParams(), 4))
    assert info.value.code == "unknown_speaker"
    with pytest.raises(InvalidRequestError, match="max_new_frames"):
        engine.add_request(EngineRequest("x", make_request(tokenizer, TEXTS[0]), 1, SamplingParams(), 0))
    with pytest.raises(InvalidRequestError, match="request_id"):
        engine.add_request(EngineRequest("", make_request(tokenizer, TEXTS[0]), 1, SamplingParams(), 4))
    assert not engine.has_unfinished()


def test_a_failed_step_ends_its_requests_and_the_engine_keeps_serving(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=32)
    engine.add_request(EngineRequest("a", make_request(tokenizer, TEXTS[0]), 1, SamplingParams(), 3))

    def lost_device(*args):
        raise RuntimeError("device lost")

    model.talker.forward = lost_device  # an injected fault: the instance attribute shadows the method
    try:
        out = engine.step()
    finally:
        del model.talker.forward
    [failed] = out.outcomes
    assert failed.code == FailureCode.STEP_FAILED and "device lost" in failed.reason
    assert not engine.has_unfinished() and engine.scheduler.block_manager.num_free_blocks == 32
    engine.add_request(EngineRequest("b", make_request(tokenizer, TEXTS[0]), 1, SamplingParams(), 3))
    assert len(run_to_end(engine).codes["b"]) == 3
