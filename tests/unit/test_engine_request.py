"""An `EngineRequest` is checked where it is built: a field the engine cannot use is refused with
`InvalidRequestError` (code `invalid_request`) naming the field and what it takes, before anything is queued."""

from __future__ import annotations

import pytest
import torch

from services.engine.engine_request import EngineRequest
from services.engine.errors import InvalidRequestError
from services.model.prompt import PromptRequest
from services.model.sampling import SamplingParams

PROMPT = PromptRequest((1, 2, 3), speaker="ryan")


def _request(**fields) -> EngineRequest:
    return EngineRequest(**{"request_id": "r", "prompt": PROMPT, "seed": 7, "params": SamplingParams(),
                            "max_new_frames": 4, **fields})


def test_a_usable_request_keeps_its_fields():
    frames = torch.zeros((1, 16), dtype=torch.int64)
    request = _request(seed=2**64 - 1, min_new_frames=0, frames=frames, prompt_kv=torch.zeros(1), exports_kv=True)
    assert (request.seed, request.min_new_frames, request.exports_kv) == (2**64 - 1, 0, True)
    assert request.predictor_params is None and request.frames is frames


@pytest.mark.parametrize(("fields", "named"), [
    ({"request_id": ""}, "request_id must be a non-empty string"),
    ({"max_new_frames": 0}, r"max_new_frames must be an integer >= 1, got 0"),
    ({"max_new_frames": 2.0}, "max_new_frames must be an integer"),
    ({"seed": 2**64}, r"seed must be an integer in \[-9223372036854775808, 18446744073709551615\]"),
    ({"seed": True}, "seed must be an integer"),
    ({"min_new_frames": -1}, "min_new_frames must be an integer >= 0"),
    ({"min_new_frames": 1.5}, "min_new_frames must be an integer >= 0"),
    ({"prompt_kv": torch.zeros(1)}, "prompt_kv comes with the frames sampled from it"),
    ({"prompt_kv": torch.zeros(1), "frames": torch.zeros((0, 16))}, "prompt_kv comes with the frames"),
])
def test_an_unusable_field_is_refused_by_name(fields, named):
    with pytest.raises(InvalidRequestError, match=named) as refused:
        _request(**fields)
    assert refused.value.code == "invalid_request"


def test_a_request_is_immutable_once_checked():
    request = _request()
    with pytest.raises(AttributeError):
        request.max_new_frames = 0  # type: ignore[misc]
