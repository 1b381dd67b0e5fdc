"""Offline generation beyond plain greedy parity: stopping at EOS like the reference, and seeded sampling."""

from __future__ import annotations

import pytest
import torch

from services.model.generate import default_sampling, generate
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams
from tests.support.model_fixtures import reference_checkpoint
from tests.support.model_oracle_runs import reference_generate

FRAMES = 10
GREEDY = (SamplingParams(temperature=0.0, repetition_penalty=1.05), SamplingParams(temperature=0.0))


def _request(speaker: str = "alice") -> PromptRequest:
    ids = reference_checkpoint("custom_voice").tokenizer.encode(assistant_text("hello, the voice speaks"))
    return PromptRequest(tuple(ids), None, speaker, "auto", True)


def test_stops_at_eos_like_the_reference():
    """Tie EOS's head row to a code the talker likes, so both implementations meet EOS early."""
    checkpoint = reference_checkpoint("custom_voice")
    model = load_model(checkpoint.directory)
    request = _request()
    favourite = int(generate(model, request, FRAMES, *GREEDY)[3, 0])
    eos = model.config.talker.codec_eos_id
    reference = checkpoint.model
    reference_head = reference.talker.codec_head.weight
    saved = reference_head[eos].clone()
    try:
        with torch.no_grad():
            for head in (model.talker.codec_head.weight, reference_head):
                head[eos] = 1.5 * head[favourite]
        codes = generate(model, request, FRAMES, *GREEDY)
        expected = reference_generate(reference, list(request.text_ids), None, "alice", "auto", True, FRAMES)
    finally:
        with torch.no_grad():
            reference_head[eos] = saved

    assert 2 <= codes.shape[0] < FRAMES, "EOS should end the run early, but never before 2 frames"
    assert torch.equal(codes, expected.codes)
    assert eos not in codes[:, 0].tolist()


@pytest.fixture(scope="module")
def model():
    return load_model(reference_checkpoint("custom_voice").directory)


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(model):
    sampling = default_sampling(model.generation)
    assert sampling[0].temperature == 0.9 and sampling[1].top_k == 50  # the reference's defaults
    first = generate(model, _request(), FRAMES, *sampling, seed=7)
    again = generate(model, _request(), FRAMES, *sampling, seed=7)
    other = generate(model, _request(), FRAMES, *sampling, seed=8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert first.shape == (FRAMES, 16) and int(first[:, 1:].max()) < 2048


def test_greedy_defaults_keep_only_the_repetition_penalty(model):
    talker, predictor = default_sampling(model.generation, greedy=True)
    assert talker.is_greedy and predictor.is_greedy and talker.repetition_penalty == 1.05
    assert torch.equal(generate(model, _request(), 4, talker, predictor, seed=1), generate(model, _request(), 4, *GREEDY))
