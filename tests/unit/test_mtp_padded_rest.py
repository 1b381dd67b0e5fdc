"""The mtp replica's padded code-predictor steps (graphed on CUDA; run eagerly here over the same static, padded
inputs) give `predict_rest`'s codes: every mix of sampling parameters, row counts that pad, a step larger than every
bucket, and padding rows left behind by a larger step."""

from __future__ import annotations

import logging

import pytest
import torch

from services.engine.model_ops import predict_rest
from services.engine.predictor_graphs import CAPPED, WHOLE
from services.model.sampling import RowSampling, SamplingParams
from services.mtp.padded_rest import PaddedRestPredictor
from tests.support.engine_helpers import load_tiny, refuse_captures

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)[0]


def step(model, params: list[SamplingParams], seed: int):
    generator = torch.Generator().manual_seed(seed)
    rows = len(params)
    hidden = torch.randn(rows, model.talker.hidden_size, generator=generator)
    c0 = torch.randint(0, model.config.talker.code_predictor.vocab_size, (rows,), generator=generator)
    frames = torch.randint(0, 40, (rows,), generator=generator).tolist()
    return hidden, c0, RowSampling.build(params, [77 + seed * 5 + row for row in range(rows)], frames)


@torch.inference_mode()
def test_padded_steps_give_predict_rest_s_codes(model):
    padded = PaddedRestPredictor(model, max_rows=4, capture=False)
    mixes = [
        [SamplingParams(), GREEDY, SamplingParams(top_k=5, temperature=1.3)],  # 3 rows: padded to 4
        [GREEDY],
        [SamplingParams(top_k=0), SamplingParams(top_p=0.6), GREEDY, SamplingParams()],  # top-p, the whole vocabulary
        [SamplingParams(top_p=0.8)] * 2,
        [SamplingParams()] * 5,  # larger than every bucket: eager
    ]
    for seed, params in enumerate(mixes):
        hidden, c0, rows = step(model, params, seed)
        expected = predict_rest(model, hidden, c0, rows)
        got = padded.predict(hidden, c0, rows)
        assert got.shape == (len(params), 15) and torch.equal(got, expected), seed
    # Rows left behind by the 4-row steps were padding for the 2- and 1-row steps: they changed nothing above.
    assert set(padded.graphs) == {(4, CAPPED), (1, CAPPED), (4, WHOLE), (2, CAPPED)}


@torch.inference_mode()
def test_the_default_mode_is_prepared_for_every_bucket(model):
    padded = PaddedRestPredictor(model, max_rows=8, capture=False)
    padded.prepare_all()
    assert set(padded.graphs) == {(rows, CAPPED) for rows in (1, 2, 4, 8)}  # on the CPU the fused draws never serve


@torch.inference_mode()
def test_a_failed_capture_runs_every_step_eagerly_and_is_counted(model, monkeypatch, caplog):
    padded = PaddedRestPredictor(model, max_rows=4, capture=False)
    padded.graph_capture.is_capturing = True  # as on CUDA, with no device here: the capture is what fails
    attempts = refuse_captures(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="services.mtp.padded_rest"):
        for seed, params in enumerate([[SamplingParams()] * 3, [SamplingParams(top_k=0), GREEDY]]):
            hidden, c0, rows = step(model, params, seed)
            assert torch.equal(padded.predict(hidden, c0, rows), predict_rest(model, hidden, c0, rows)), seed
    # Tried once, then never again (a failed capture can leave the graph pool unusable); both steps still ran.
    assert len(attempts) == 1 and padded.num_capture_failures == 1 and not padded.graph_capture.is_capturing
    assert set(padded.graphs) == {(4, CAPPED), (2, WHOLE)}
    [failure] = [r for r in caplog.records if r.name == "services.mtp.padded_rest"]
    assert "the code predictor's step (rows bucket 4, capped) failed" in failure.getMessage()


@torch.inference_mode()
def test_draws_follow_the_keys_alone(model):
    """The static inputs hold the rows' hash keys, not their seeds and frames: rows given keys of other seeds draw
    what those seeds draw, as `predict_rest` does."""
    padded = PaddedRestPredictor(model, max_rows=4, capture=False)
    params = [SamplingParams(temperature=1.5, top_k=0)] * 3
    hidden, c0, rows = step(model, params, seed=7)
    other_seeds = RowSampling.build(params, [5, 6, 7], [1, 2, 3])
    rekeyed = RowSampling.build(params, rows.seed.tolist(), rows.frame.tolist(), keys=other_seeds.keys)
    expected = predict_rest(model, hidden, c0, other_seeds)
    assert torch.equal(padded.predict(hidden, c0, rekeyed), expected)
    assert not torch.equal(expected, predict_rest(model, hidden, c0, rows)), "the seeds must matter for the check"
