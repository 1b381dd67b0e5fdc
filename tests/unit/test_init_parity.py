"""A `model init` checkpoint gives the same greedy codes in the reference as in our offline generate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.model.generate import default_sampling, generate
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text, instruct_text
from services.model.text_tokenizer import TextTokenizer
from tests.support.oracle.reference import load

MAX_FRAMES = 40

CASES = [
    # (checkpoint, text, speaker, language, non_streaming, instruct)
    ("custom_voice", "Hello there, this is a test of the system.", "ryan", "english", True, None),
    ("custom_voice", "The quick brown fox jumps over the lazy dog.", "eric", "auto", False, None),
    ("custom_voice", "Numbers like 42 and 7 are read one digit at a time.", "vivian", "chinese", True, None),
    ("voice_design", "Please read this sentence slowly and clearly.", None, "english", True, "A calm, deep voice."),
]


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint: Path, tiny_voice_design_checkpoint: Path) -> dict[str, Path]:
    return {"custom_voice": tiny_checkpoint, "voice_design": tiny_voice_design_checkpoint}


@pytest.fixture(scope="module")
def reference_models(checkpoints):
    load()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import AutoConfig, PreTrainedModel

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig)
    # HF's own from_pretrained: the reference's override also loads speech_tokenizer/, unused here.
    return {
        kind: PreTrainedModel.from_pretrained.__func__(Qwen3TTSForConditionalGeneration, str(path)).eval()
        for kind, path in checkpoints.items()
    }


def reference_codes(model, text_ids, instruct_ids, speaker, language, non_streaming) -> torch.Tensor:
    with torch.no_grad():
        codes, _ = model.generate(
            input_ids=[torch.tensor([text_ids])],
            instruct_ids=[torch.tensor([instruct_ids]) if instruct_ids else None],
            languages=[language],
            speakers=[speaker],
            non_streaming_mode=non_streaming,
            max_new_tokens=MAX_FRAMES + 1,  # the reference counts its last, unfinished step
            do_sample=False,
            subtalker_dosample=False,
            repetition_penalty=1.05,
        )
    return codes[0]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{c[3]}-{'non' if c[4] else ''}streaming" for c in CASES])
def test_greedy_codes_equal_the_reference(checkpoints, reference_models, case):
    kind, text, speaker, language, non_streaming, instruct = case
    tokenizer = TextTokenizer.from_dir(checkpoints[kind])
    text_ids = tokenizer.encode(assistant_text(text))
    instruct_ids = tokenizer.encode(instruct_text(instruct)) if instruct else None
    expected = reference_codes(reference_models[kind], text_ids, instruct_ids, speaker, language, non_streaming)

    model = load_model(checkpoints[kind])
    talker_sampling, predictor_sampling = default_sampling(model.generation, greedy=True)
    request = PromptRequest(
        text_ids=tuple(text_ids), instruct_ids=tuple(instruct_ids) if instruct_ids else None,
        speaker=speaker, language=language, non_streaming=non_streaming,
    )
    ours = generate(model, request, MAX_FRAMES, talker_sampling, predictor_sampling)
    assert ours.shape[1] == 16 and ours.shape[0] >= 2
    assert torch.equal(ours, expected.to(ours.dtype))
    assert len(set(ours[:, 0].tolist())) > 1, "a lively checkpoint does not repeat one code"


def test_the_reference_high_level_api_loads_and_speaks(tiny_checkpoint):
    """Qwen3TTSModel.from_pretrained: AutoModel + AutoProcessor + speech_tokenizer/ + generation_config.json."""
    qwen_tts = load()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(tiny_checkpoint))
    assert sorted(tts.get_supported_speakers()) == ["eric", "ryan", "vivian"]
    assert tts.generate_defaults["top_k"] == 50
    text = assistant_text("Hello, world! 123 ünïcödé")
    reference_ids = tts.processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()
    assert reference_ids == TextTokenizer.from_dir(tiny_checkpoint).encode(text)
    wavs, sample_rate = tts.generate_custom_voice(
        text="Hello there.", speaker="ryan", language="english", do_sample=False, subtalker_dosample=False,
        max_new_tokens=12,
    )
    assert sample_rate == 24000 and wavs[0].shape[0] % 1920 == 0 and wavs[0].shape[0] > 0
    assert float((wavs[0] ** 2).mean() ** 0.5) > 0.01, "the codec should make audible audio"
