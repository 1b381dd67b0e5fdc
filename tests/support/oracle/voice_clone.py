"""The reference package's whole voice-cloning path, text and reference audio in, audio out: its
`Qwen3TTSModel.generate_voice_clone`, greedy, on a checkpoint directory (speech tokenizer included).

The audio it returns is what the mesh's must equal: for an in-context clone the reference decodes its reference
frames in front of the generated ones and cuts their part off (qwen_tts/inference/qwen3_tts_model.py,
`generate_voice_clone`: `codes_for_decode` and `cut`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.support.oracle.reference import load


def load_wrapper(directory: Path):
    """The reference's `Qwen3TTSModel` (model, speech tokenizer, processor) over a checkpoint directory."""
    load()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from transformers import AutoConfig, AutoProcessor, PreTrainedModel

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    # HF's own from_pretrained: the reference's override would look the speech tokenizer up on the Hub.
    model = PreTrainedModel.from_pretrained.__func__(Qwen3TTSForConditionalGeneration, str(directory)).eval()
    model.load_speech_tokenizer(Qwen3TTSTokenizer.from_pretrained(str(directory / "speech_tokenizer")))
    processor = AutoProcessor.from_pretrained(str(directory), fix_mistral_regex=True)
    return Qwen3TTSModel(model, processor=processor)


def clone_audio(wrapper, directory: Path, text: str, samples: np.ndarray, sample_rate: int, ref_text: str | None,
                x_vector_only: bool, max_frames: int) -> np.ndarray:
    """Float samples of `text` in the voice of `samples`: greedy (talker and code predictor), non-streaming text,
    language auto, the checkpoint's repetition penalty; at most `max_frames` frames (the reference makes at most
    max_new_tokens - 1)."""
    import torch

    generation = json.loads((directory / "generation_config.json").read_text())
    with torch.no_grad():
        wavs, _ = wrapper.generate_voice_clone(
            text=text, ref_audio=(samples, sample_rate), ref_text=ref_text, x_vector_only_mode=x_vector_only,
            non_streaming_mode=True, do_sample=False, subtalker_dosample=False,
            repetition_penalty=generation.get("repetition_penalty", 1.05), max_new_tokens=max_frames + 1)
    return np.asarray(wavs[0], dtype=np.float32)
