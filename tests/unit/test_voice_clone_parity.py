"""Voice cloning against the reference `qwen-tts`, both modes (x-vector only, in context), both text modes.

1. On a `voxmesh model init --type base` checkpoint the reference loads whole (speech tokenizer included): the
   reference's own `create_voice_clone_prompt` against our `VoiceCloner` (x-vector within tolerance, reference
   codes identical), then greedy generation (codes identical, prompt rows and logits within tolerance).
2. On the reference's own base checkpoint with large weights (wide logit margins): the same voice prompt given
   to both sides, so the prompt rows of in-context cloning are compared where a slip would change every code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from services.model.generate import GenerationTrace, default_sampling, generate
from services.model.loader import TTSModel, load_model
from services.model.prompt import PromptRequest, assistant_text, build_prompt
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from services.model.voice.voice_prompt import VoicePrompt, reference_text
from tests.support.model_fixtures import reference_checkpoint
from tests.support.model_oracle_runs import reference_generate
from tests.support.oracle.reference import load as load_reference

MAX_FRAMES = 40
ROW_TOLERANCE = 1e-5
LOGIT_TOLERANCE = 1e-4
REF_TEXT = "This is the reference voice."
TEXT = "Hello there, this is a cloned voice speaking."


def reference_audio(sample_rate: int, seconds: float = 3.0, seed: int = 5) -> np.ndarray:
    """A voiced-sounding test signal: a 220 Hz tone with harmonics, and a little noise."""
    t = torch.arange(int(sample_rate * seconds)) / sample_rate
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed))
    tone = sum(0.3 / k * torch.sin(2 * torch.pi * 220 * k * t) for k in (1, 2, 3))
    return (tone + 0.05 * noise).numpy().astype(np.float32)


@dataclass(frozen=True)
class Sides:
    reference: object
    """The reference `Qwen3TTSForConditionalGeneration`, with its speech tokenizer."""
    wrapper: object
    """The reference's `Qwen3TTSModel` around it (`create_voice_clone_prompt`)."""
    model: TTSModel
    tokenizer: TextTokenizer
    cloner: VoiceCloner


@pytest.fixture(scope="module")
def sides(tiny_base_checkpoint: Path) -> Sides:
    load_reference()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from transformers import AutoConfig, PreTrainedModel

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    # HF's own from_pretrained (the reference's override would look the speech tokenizer up on the Hub), then the
    # speech tokenizer from the same directory, as the reference's loader does.
    reference = PreTrainedModel.from_pretrained.__func__(Qwen3TTSForConditionalGeneration,
                                                         str(tiny_base_checkpoint)).eval()
    reference.load_speech_tokenizer(Qwen3TTSTokenizer.from_pretrained(str(tiny_base_checkpoint / "speech_tokenizer")))
    model = load_model(tiny_base_checkpoint)
    tokenizer = TextTokenizer.from_dir(tiny_base_checkpoint)
    return Sides(reference, Qwen3TTSModel(reference, processor=None), model, tokenizer,
                 VoiceCloner.load(model, tokenizer))


def reference_prompt(sides: Sides, audio: np.ndarray, sample_rate: int, x_vector_only: bool) -> dict:
    items = sides.wrapper.create_voice_clone_prompt(ref_audio=(audio, sample_rate), ref_text=REF_TEXT,
                                                    x_vector_only_mode=x_vector_only)
    return sides.wrapper._prompt_items_to_voice_clone_prompt(items)


@pytest.mark.parametrize("x_vector_only", [True, False], ids=["x-vector", "in-context"])
def test_voice_prompt_equals_the_reference(sides: Sides, x_vector_only: bool):
    audio = reference_audio(24000)
    expected = reference_prompt(sides, audio, 24000, x_vector_only)
    ours = sides.cloner.make_prompt(audio, 24000, REF_TEXT, x_vector_only)
    torch.testing.assert_close(ours.speaker_embedding, expected["ref_spk_embedding"][0].float(), atol=1e-5, rtol=1e-5)
    if x_vector_only:
        assert ours.ref_codes is None and expected["ref_code"][0] is None
        return
    assert ours.ref_codes.shape == (38, 16)  # ceil(72000 / 1920)
    assert torch.equal(ours.ref_codes, expected["ref_code"][0])
    assert len(set(ours.ref_codes[:, 0].tolist())) > 10, "degenerate encoder: the reference frames repeat one code"
    expected_ids = sides.tokenizer.encode(reference_text(REF_TEXT))[3:-2]
    assert ours.ref_text_ids == tuple(expected_ids)


def test_other_sample_rates_are_resampled_close_to_the_reference(sides: Sides):
    """The reference resamples with soxr (through librosa), we with our own windowed sinc: the x-vectors agree
    closely, not exactly."""
    audio = reference_audio(44100)
    expected = reference_prompt(sides, audio, 44100, x_vector_only=True)["ref_spk_embedding"][0].float()
    ours = sides.cloner.make_prompt(audio, 44100, None, x_vector_only=True).speaker_embedding
    assert torch.nn.functional.cosine_similarity(ours, expected, dim=0) > 0.9999
    torch.testing.assert_close(ours, expected, atol=2e-2 * float(expected.abs().max()), rtol=0)


CASES = [
    # x_vector_only, non_streaming, language
    (True, True, "english"),
    (True, False, "auto"),
    (False, True, "english"),
    (False, False, "auto"),
]


@pytest.mark.parametrize("x_vector_only,non_streaming,language", CASES,
                         ids=[f"{'x-vector' if c[0] else 'in-context'}-{'non-' if c[1] else ''}streaming"
                              for c in CASES])
def test_greedy_cloned_codes_and_logits_equal_the_reference(sides: Sides, x_vector_only, non_streaming, language):
    audio = reference_audio(24000)
    text_ids = sides.tokenizer.encode(assistant_text(TEXT))
    expected = reference_generate(
        sides.reference, text_ids, None, None, language, non_streaming, MAX_FRAMES,
        ref_ids=sides.tokenizer.encode(reference_text(REF_TEXT)),
        voice_clone_prompt=reference_prompt(sides, audio, 24000, x_vector_only))
    voice = sides.cloner.make_prompt(audio, 24000, REF_TEXT, x_vector_only)
    request = PromptRequest(tuple(text_ids), language=language, non_streaming=non_streaming, voice=voice)
    prompt = build_prompt(sides.model.talker, sides.model.config, request)
    torch.testing.assert_close(prompt.embeds, expected.prompt_embeds, atol=ROW_TOLERANCE, rtol=0)
    trailing = prompt.trailing if prompt.trailing.shape[0] else prompt.tts_pad[None]
    torch.testing.assert_close(trailing, expected.trailing, atol=ROW_TOLERANCE, rtol=0)

    trace = GenerationTrace()
    codes = generate(sides.model, request, MAX_FRAMES, *default_sampling(sides.model.generation, greedy=True),
                     trace=trace)
    assert codes.shape[0] >= 4 and torch.equal(codes, expected.codes)
    assert len(set(codes[:, 0].tolist())) > 2, "degenerate weights: the frames repeat one code"
    for step, (mine, theirs) in enumerate(zip(trace.talker_logits, expected.talker_logits)):
        torch.testing.assert_close(mine, theirs, atol=LOGIT_TOLERANCE, rtol=0, msg=f"talker logits, step {step}")
    for frame, (mine, theirs) in enumerate(zip(trace.code_logits, expected.code_logits)):
        torch.testing.assert_close(mine, theirs, atol=LOGIT_TOLERANCE, rtol=0, msg=f"predictor logits, frame {frame}")


@pytest.mark.parametrize("non_streaming,text", [(True, TEXT), (False, TEXT), (False, "hi")],
                         ids=["non-streaming", "streaming-text-longer", "streaming-codes-longer"])
def test_in_context_prompt_rows_with_wide_margins(non_streaming: bool, text: str):
    """Large random weights: any misplaced row changes every logit. The reference's checkpoint has no speech
    tokenizer, so both sides get the same voice prompt (random reference frames); in streaming text mode the
    text is either longer than the reference frames (the surplus trails) or shorter (tts_pad fills in)."""
    checkpoint = reference_checkpoint("base")
    model, tokenizer = load_model(checkpoint.directory), checkpoint.tokenizer
    generator = torch.Generator().manual_seed(3)
    frames = 6 if len(text) > 10 else 12
    voice = VoicePrompt(speaker_embedding=torch.randn(model.talker.hidden_size, generator=generator),
                        ref_codes=torch.randint(0, 2048, (frames, 16), generator=generator),
                        ref_text_ids=tuple(tokenizer.encode(reference_text(REF_TEXT))[3:-2]))
    text_ids = tokenizer.encode(assistant_text(text))
    reference_voice = {"ref_code": [voice.ref_codes], "ref_spk_embedding": [voice.speaker_embedding],
                       "x_vector_only_mode": [False], "icl_mode": [True]}
    expected = reference_generate(checkpoint.model, text_ids, None, None, "auto", non_streaming, 10,
                                  ref_ids=tokenizer.encode(reference_text(REF_TEXT)), voice_clone_prompt=reference_voice)
    request = PromptRequest(tuple(text_ids), non_streaming=non_streaming, voice=voice)
    prompt = build_prompt(model.talker, model.config, request)
    torch.testing.assert_close(prompt.embeds, expected.prompt_embeds, atol=ROW_TOLERANCE, rtol=0)
    trace = GenerationTrace()
    codes = generate(model, request, 10, *default_sampling(model.generation, greedy=True), trace=trace)
    assert torch.equal(codes, expected.codes)
    for step, (mine, theirs) in enumerate(zip(trace.talker_logits, expected.talker_logits)):
        torch.testing.assert_close(mine, theirs, atol=LOGIT_TOLERANCE, rtol=0, msg=f"talker logits, step {step}")
