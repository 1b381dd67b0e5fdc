"""`min_new_tokens` (the API's extra): EOS is kept away for that many frames, and the frames before are unchanged.

The request field travels gateway -> SynthesisRequest -> decode -> `EngineRequest.min_new_frames`; the
gateway part is checked in test_http_speech.py, this is the engine part with the real tiny model.
"""

from __future__ import annotations

import pytest
import torch

from services.engine.engine import InvalidRequestError
from services.engine.sequence import SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import load_tiny, make_request, new_engine, run_to_end

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _run(model, request, budget: int, min_new_frames: int | None):
    engine = new_engine(model, blocks=256)
    assert engine.add_request(EngineRequest("r", request, 5, GREEDY, budget, min_new_frames=min_new_frames)) is None
    run = run_to_end(engine)
    return run.stacked("r"), run.outcomes[0]


def test_min_new_frames_holds_eos_back_then_lets_it_end(tiny):
    model, tokenizer = tiny
    request = make_request(tokenizer, "Short.", "ryan", "english")
    natural, natural_end = _run(model, request, 300, None)
    assert natural_end.status == SequenceStatus.FINISHED_EOS, "the tiny model must end this text by itself"
    floor = natural.shape[0] + 4
    longer, longer_end = _run(model, request, 300, floor)
    assert longer.shape[0] >= floor
    torch.testing.assert_close(longer[: natural.shape[0]], natural, rtol=0, atol=0)
    assert not (longer[:floor, 0] == model.config.talker.codec_eos_id).any()
    assert longer_end.status in (SequenceStatus.FINISHED_EOS, SequenceStatus.FINISHED_LENGTH)


def test_min_new_frames_above_the_budget_stops_at_the_budget(tiny):
    model, tokenizer = tiny
    frames, end = _run(model, make_request(tokenizer, "Short.", "ryan", "english"), 6, 50)
    assert (frames.shape[0], end.status) == (6, SequenceStatus.FINISHED_LENGTH)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_min_new_frames_must_be_a_non_negative_integer(tiny, bad):
    model, tokenizer = tiny
    engine = new_engine(model, blocks=64)
    with pytest.raises(InvalidRequestError, match="min_new_frames"):
        engine.add_request(EngineRequest(
            "r", make_request(tokenizer, "Short.", "ryan", "english"), 5, GREEDY, 10, min_new_frames=bad))
