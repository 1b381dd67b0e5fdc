"""bfloat16, and CUDA where there is one: the same entry points in other dtypes and on other devices.

bfloat16 cannot be bit-equal to anything but itself: with these large random weights a logit is a few bf16
ulps (about 0.06 at magnitude 10) from the reference's bf16 logit, and greedy codes drift apart once a
near-tie flips. So bf16 is checked by its logits, relative to their scale, and by running to the end.
CUDA float32 is held to the CPU tolerances.
"""

from __future__ import annotations

import pytest
import torch

from services.model.generate import GenerationTrace, generate
from services.model.loader import load_model
from services.model.prompt import make_request
from services.model.sampling import SamplingParams
from tests.support.model_fixtures import reference_checkpoint, reference_model
from tests.support.model_oracle_runs import reference_generate

FRAMES = 8
GREEDY = (SamplingParams(temperature=0.0, repetition_penalty=1.05), SamplingParams(temperature=0.0))
BF16_RELATIVE_TOLERANCE = 0.03
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _request(non_streaming: bool):
    tokenizer = reference_checkpoint("custom_voice").tokenizer
    return make_request(tokenizer, "hello, the voice speaks.", speaker="alice", non_streaming=non_streaming)


def _assert_relatively_close(mine: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    scale = theirs.abs().max()
    error = (mine.cpu() - theirs).abs().max()
    assert error <= BF16_RELATIVE_TOLERANCE * scale, f"{what}: max error {error:.4f} at scale {scale:.2f}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("non_streaming", [True, False])
def test_bfloat16_runs_and_stays_close_to_the_reference_in_bfloat16(device, non_streaming):
    model = load_model(reference_checkpoint("custom_voice").directory, dtype=torch.bfloat16, device=device)
    assert model.dtype == torch.bfloat16 and model.code_predictor.lm_head[0].weight.dtype == torch.bfloat16
    request = _request(non_streaming)
    expected = reference_generate(
        reference_model("custom_voice").to(torch.bfloat16), list(request.text_ids), None, "alice", "auto", non_streaming, FRAMES
    )
    trace = GenerationTrace()
    codes = generate(model, request, FRAMES, *GREEDY, trace=trace)

    assert codes.shape == (FRAMES, 16) and codes.dtype == torch.long
    assert int(codes[:, 0].max()) < 2048 and int(codes[:, 1:].max()) < 2048
    _assert_relatively_close(trace.talker_logits[0], expected.talker_logits[0], "prefill logits")
    if torch.equal(codes[0, 0], expected.codes[0, 0]):
        _assert_relatively_close(trace.code_logits[0][0], expected.code_logits[0][0], "code predictor logits, codebook 1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_float32_matches_the_cpu():
    directory = reference_checkpoint("custom_voice").directory
    for non_streaming in (True, False):
        request = _request(non_streaming)
        cpu_trace, cuda_trace = GenerationTrace(), GenerationTrace()
        cpu = generate(load_model(directory), request, FRAMES, *GREEDY, trace=cpu_trace)
        cuda = generate(load_model(directory, device="cuda"), request, FRAMES, *GREEDY, trace=cuda_trace)
        assert torch.equal(cpu, cuda)
        for mine, theirs in zip(cuda_trace.talker_logits + cuda_trace.code_logits, cpu_trace.talker_logits + cpu_trace.code_logits):
            torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=0)
