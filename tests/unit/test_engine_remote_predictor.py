"""An engine whose codebooks 1..15 come from a predictor outside the runner (the `mtp` topology's seam) gives the
codes of the local predictor: the predictor is handed only what a remote replica gets (hidden states, codebook 0,
seeds, frame indices and per-row parameters) and rebuilds the keyed sampler from them, as `services.mtp` does."""

from __future__ import annotations

import pytest
import torch

from services.engine import model_ops
from services.model.sampling import RowSampling, SamplingParams
from services.engine.engine_request import EngineRequest
from tests.support.engine_helpers import TEXTS, load_tiny, make_request, new_engine, run_to_end

NUM_FRAMES = 10
PARAMS = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=20),
          SamplingParams(temperature=0.7, top_p=0.8))


class RebuildingPredictor:
    """Runs the code predictor from the rows' wire fields alone, and counts the rows it was asked for."""

    def __init__(self, model) -> None:
        self.model = model
        self.num_rows = 0

    def predict_rest(self, hidden, c0, seeds, frames, params):
        self.num_rows += len(seeds)
        rows = RowSampling.build(params, seeds, frames, hidden.device)
        return model_ops.predict_rest(self.model, hidden.clone(), c0.clone(), rows)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def run(tiny, predictor=None):
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, remote_predictor=predictor)
    for index, params in enumerate(PARAMS):
        assert engine.add_request(EngineRequest(
            f"r{index}", make_request(tokenizer, TEXTS[index]), 100 + index, params, NUM_FRAMES,
            predictor_params=PARAMS[(index + 1) % len(PARAMS)])) is None
    return run_to_end(engine)


def test_codes_from_an_outside_predictor_equal_the_local_ones(tiny):
    model, _ = tiny
    predictor = RebuildingPredictor(model)
    local, remote = run(tiny), run(tiny, predictor)
    for index in range(len(PARAMS)):
        assert torch.equal(remote.stacked(f"r{index}"), local.stacked(f"r{index}")), index
    assert predictor.num_rows == sum(len(codes) for codes in remote.codes.values())


class ReturningPredictor:
    """Replicas that never answer (the client's error, as RemotePredictor raises it after its attempts) until they
    are back (`back()`), then answer as `RebuildingPredictor`."""

    def __init__(self, model) -> None:
        self.num_silent_calls = 0
        self._answering: RebuildingPredictor | None = None
        self._model = model

    def back(self) -> None:
        self._answering = RebuildingPredictor(self._model)

    def predict_rest(self, hidden, c0, seeds, frames, params):
        if self._answering is not None:
            return self._answering.predict_rest(hidden, c0, seeds, frames, params)
        self.num_silent_calls += 1
        raise TimeoutError("no mtp replica answered step 0 (tried mtp-a, mtp-b)")


def test_a_step_the_remote_predictor_cannot_serve_ends_its_requests_at_once(tiny):
    model, tokenizer = tiny
    replicas = ReturningPredictor(model)
    engine = new_engine(model, blocks=96, remote_predictor=replicas)
    for index in range(2):
        assert engine.add_request(EngineRequest(
            f"r{index}", make_request(tokenizer, TEXTS[index]), index, PARAMS[0], NUM_FRAMES)) is None
    run = run_to_end(engine)
    assert replicas.num_silent_calls == 1, "no re-runs to find a culprit: the replicas failed, not a request"
    assert sorted(o.request_id for o in run.outcomes) == ["r0", "r1"]
    assert all(o.code == "step_failed" and "code-predictor replicas" in o.reason for o in run.outcomes)
    assert engine.stats().num_free_kv_blocks == engine.stats().num_kv_blocks
    replicas.back()  # the replicas are back: it serves on
    assert engine.add_request(EngineRequest("after", make_request(tokenizer, TEXTS[2]), 7, PARAMS[0], 3)) is None
    assert len(run_to_end(engine).stacked("after")) == 3
