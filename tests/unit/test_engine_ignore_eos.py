"""`ignore_eos` (fixed-length benchmarks): EOS is never drawn before the frame budget, and nothing else changes."""

from __future__ import annotations

import pytest
import torch

from services.engine.sequence import SequenceStatus
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import load_tiny, make_request, new_engine, run_to_end

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _run(model, request, budget: int, ignore_eos: bool):
    engine = new_engine(model, blocks=256)
    assert engine.add_request(EngineRequest("r", request, 5, GREEDY, budget, ignore_eos=ignore_eos)) is None
    run = run_to_end(engine)
    return run.stacked("r") if "r" in run.codes else torch.zeros(0, 16), run.outcomes[0]


def test_ignore_eos_runs_to_the_budget_and_keeps_the_frames_before_eos(tiny):
    model, tokenizer = tiny
    request = make_request(tokenizer, "Short.", "ryan", "english")
    natural, natural_end = _run(model, request, 300, ignore_eos=False)
    assert natural_end.status == SequenceStatus.FINISHED_EOS, "the tiny model must end this text by itself"
    budget = natural.shape[0] + 5
    fixed, fixed_end = _run(model, request, budget, ignore_eos=True)
    assert fixed_end.status == SequenceStatus.FINISHED_LENGTH
    assert fixed.shape[0] == budget
    torch.testing.assert_close(fixed[: natural.shape[0]], natural, rtol=0, atol=0)
    eos = model.config.talker.codec_eos_id
    assert not (fixed[:, 0] == eos).any()
