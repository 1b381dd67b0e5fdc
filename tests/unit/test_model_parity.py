"""voxmesh's talker and code predictor against the reference `qwen-tts`, on tiny checkpoints built and saved
by the reference: the same prompt rows, the same greedy codes frame by frame, logits within 1e-4."""

from __future__ import annotations

import pytest
import torch

from services.model.generate import GenerationTrace, generate
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text, build_prompt, instruct_text
from services.model.sampling import SamplingParams
from tests.support.model_fixtures import reference_checkpoint
from tests.support.model_oracle_runs import reference_generate

FRAMES = 10
LOGIT_TOLERANCE = 1e-4
TEXTS = {
    "short": "hello",
    "sentence": "hello, the voice and the speaker speak.",
    "unicode": "Grüße aus Köln — 你好, wie geht's?",
}
INSTRUCT = "speak slowly, in a warm and low voice"


def greedy(repetition_penalty: float) -> tuple[SamplingParams, SamplingParams]:
    """The reference's do_sample=False / subtalker_dosample=False: argmax after the talker's logit processing."""
    return SamplingParams(temperature=0.0, repetition_penalty=repetition_penalty), SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def loaded():
    """voxmesh models of the reference checkpoints, loaded once per variant."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_model(reference_checkpoint(name).directory)
        return cache[name]

    return get


CASES = [
    # variant, text, speaker, language, non_streaming, instruct
    ("custom_voice", "sentence", "alice", "auto", True, None),
    ("custom_voice", "sentence", "alice", "auto", False, None),
    ("custom_voice", "unicode", "bob", "english", True, None),
    ("custom_voice", "unicode", "bob", "English", False, None),
    ("custom_voice", "short", "chen", "auto", True, None),  # dialect speaker: language becomes the dialect
    ("custom_voice", "short", "chen", "chinese", False, None),
    ("custom_voice", "sentence", "Chen", "german", True, None),  # named non-Chinese language: no dialect
    ("custom_voice", "sentence", None, "auto", False, None),  # no speaker row
    ("custom_voice", "unicode", "alice", "german", True, INSTRUCT),  # 1.7B custom voice follows instructions
    ("voice_design", "sentence", None, "auto", True, INSTRUCT),
    ("voice_design", "unicode", None, "english", False, INSTRUCT),
    ("voice_design", "short", None, "auto", True, None),
    ("sharded", "sentence", "bob", "auto", False, None),
]


def _ids(variant: str, text: str, instruct: str | None) -> tuple[list[int], list[int] | None]:
    tokenizer = reference_checkpoint(variant).tokenizer
    return tokenizer.encode(assistant_text(text)), tokenizer.encode(instruct_text(instruct)) if instruct else None


@pytest.mark.parametrize("variant,text,speaker,language,non_streaming,instruct", CASES)
def test_greedy_codes_and_logits_match_reference(loaded, variant, text, speaker, language, non_streaming, instruct):
    text_ids, instruct_ids = _ids(variant, TEXTS[text], instruct)
    expected = reference_generate(
        reference_checkpoint(variant).model, text_ids, instruct_ids, speaker, language, non_streaming, FRAMES
    )
    model = loaded(variant)
    request = PromptRequest(tuple(text_ids), tuple(instruct_ids) if instruct_ids else None, speaker, language, non_streaming)
    prompt = build_prompt(model.talker, model.config, request)
    torch.testing.assert_close(prompt.embeds, expected.prompt_embeds, atol=1e-5, rtol=0)
    if not non_streaming:
        torch.testing.assert_close(prompt.trailing, expected.trailing, atol=1e-5, rtol=0)

    trace = GenerationTrace()
    codes = generate(model, request, FRAMES, *greedy(1.05), trace=trace)

    assert codes.shape == (FRAMES, 16)
    for frame, (mine, theirs) in enumerate(zip(codes, expected.codes, strict=True)):
        assert torch.equal(mine, theirs), f"frame {frame}: {mine.tolist()} != {theirs.tolist()}"
    assert len(set(codes[:, 0].tolist())) > 1, "degenerate weights: every frame has the same codebook 0"
    for step, (mine, theirs) in enumerate(zip(trace.talker_logits, expected.talker_logits)):
        torch.testing.assert_close(mine, theirs, atol=LOGIT_TOLERANCE, rtol=0, msg=f"talker logits, step {step}")
    assert len(trace.code_logits) == len(expected.code_logits) == FRAMES
    for frame, (mine, theirs) in enumerate(zip(trace.code_logits, expected.code_logits)):
        torch.testing.assert_close(mine, theirs, atol=LOGIT_TOLERANCE, rtol=0, msg=f"code predictor logits, frame {frame}")


def test_small_custom_voice_model_ignores_instructions_like_the_reference(loaded):
    """The reference's high-level API drops the instruction for the 0.6B custom-voice model."""
    text_ids, instruct_ids = _ids("custom_voice_0b6", TEXTS["sentence"], INSTRUCT)
    expected = reference_generate(
        reference_checkpoint("custom_voice_0b6").model, text_ids, None, "alice", "auto", True, FRAMES
    )
    request = PromptRequest(tuple(text_ids), tuple(instruct_ids), "alice", "auto", True)
    assert torch.equal(generate(loaded("custom_voice_0b6"), request, FRAMES, *greedy(1.05)), expected.codes)


def test_repetition_penalty_is_applied_like_the_reference(loaded):
    """A strong penalty changes the greedy codes; both implementations change them the same way."""
    text_ids, _ = _ids("custom_voice", TEXTS["sentence"], None)
    expected = reference_generate(
        reference_checkpoint("custom_voice").model, text_ids, None, "alice", "auto", True, FRAMES, repetition_penalty=3.0
    )
    request = PromptRequest(tuple(text_ids), None, "alice", "auto", True)
    assert torch.equal(generate(loaded("custom_voice"), request, FRAMES, *greedy(3.0)), expected.codes)
