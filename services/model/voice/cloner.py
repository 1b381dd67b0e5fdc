"""Reference audio -> a ready `VoicePrompt`: the speaker encoder's x-vector, and in in-context mode the codec
encoder's frames and the tokenized transcript.

This is the only audio work voice cloning does, and it is heavy next to a decode step (a mel, a CNN over it, a
transformer over the audio): callers run `make_prompt` off the step loop (decode runs it on its own thread) and
hand the engine the finished prompt. On CUDA it runs on its own stream, so it neither waits behind nor delays the
steps queued on the default stream.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from services.model.codec.encoder import CodecEncoder
from services.model.codec.encoder_loader import load_codec_encoder
from services.model.config import TTSConfig
from services.model.loader import TTSModel
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.limits import check_reference
from services.model.voice.mel import LogMel, MelSettings
from services.model.voice.resample import resample
from services.model.voice.speaker_encoder import SpeakerEncoder
from services.model.voice.voice_prompt import REF_ROLE_TOKENS, REF_TAIL_TOKENS, VoicePrompt, reference_text

SPEECH_TOKENIZER_DIR = "speech_tokenizer"


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def mono_samples(samples: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Float32 mono samples [n] from [n] or [n, channels] (channels averaged, as the reference does)."""
    # A copy: the caller's buffer may be read-only (bytes from the bus) or reused.
    audio = samples.clone() if isinstance(samples, torch.Tensor) else torch.tensor(np.asarray(samples))
    if audio.dim() == 2:
        audio = audio.float().mean(dim=-1)
    if audio.dim() != 1 or audio.numel() == 0:
        raise ReferenceAudioError("invalid_ref_audio", "reference audio must be one channel of samples (or several "
                                  "channels, [samples, channels], which are mixed down)")
    audio = audio.float()
    if not bool(torch.isfinite(audio).all()):
        raise ReferenceAudioError("invalid_ref_audio", "reference audio holds NaN or infinite samples")
    return audio


class VoiceCloner:
    """Holds the speaker encoder, the codec encoder and the tokenizer of one base checkpoint."""

    def __init__(self, config: TTSConfig, speaker_encoder: SpeakerEncoder, codec_encoder: CodecEncoder,
                 tokenizer: TextEncoder) -> None:
        if config.speaker_encoder is None:
            raise ReferenceAudioError("voice_cloning_unsupported", "only base checkpoints clone voices")
        self.config, self.tokenizer = config, tokenizer
        self.speaker_encoder, self.codec_encoder = speaker_encoder, codec_encoder
        self.device = speaker_encoder.fc.weight.device
        self.speaker_rate = config.speaker_encoder.sample_rate
        self.mel = LogMel(MelSettings(sample_rate=self.speaker_rate, n_mels=config.speaker_encoder.mel_dim),
                          self.device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    @classmethod
    def load(cls, model: TTSModel, tokenizer: TextEncoder, directory: str | Path | None = None) -> VoiceCloner:
        """The cloner of a loaded base checkpoint (its speaker encoder weights are the loader's); the codec encoder
        is read from `<checkpoint>/speech_tokenizer/`, in float32 on the model's device."""
        if model.speaker_encoder is None or model.config.speaker_encoder is None:
            raise ReferenceAudioError("voice_cloning_unsupported", f"{model.directory} is a "
                                      f"{model.config.tts_model_type} checkpoint: only base checkpoints clone voices")
        speaker = SpeakerEncoder.from_checkpoint(model.config.speaker_encoder, model.speaker_encoder)
        codec = load_codec_encoder(Path(directory or model.directory) / SPEECH_TOKENIZER_DIR, device=model.device)
        return cls(model.config, speaker, codec, tokenizer)

    @classmethod
    def from_directory(cls, directory: str | Path, dtype: torch.dtype, device: str | torch.device) -> VoiceCloner:
        """The cloner of a base checkpoint directory without its talker: the config, the speaker encoder's tensors
        (in `dtype`, as the loader gives them), the codec encoder and the tokenizer; for a process that does only
        the reference-audio work (services/decode/voice_process.py)."""
        from services.model import checkpoint
        from services.model.config import load_config
        from services.model.text_tokenizer import TextTokenizer

        directory, device = Path(directory), torch.device(device)
        config, _ = load_config(directory)
        if config.speaker_encoder is None:
            raise ReferenceAudioError("voice_cloning_unsupported", f"{directory} is a {config.tts_model_type} "
                                      "checkpoint: only base checkpoints clone voices")
        expected = checkpoint.speaker_encoder_shapes(config.speaker_encoder)
        stored = checkpoint.scan(directory)
        # Only the speaker encoder's tensors are checked (missing ones, shapes): the talker's are not read here.
        checkpoint.check({name: stored[name] for name in expected if name in stored}, expected, directory)
        tensors = checkpoint.load_tensors(stored, list(expected), dtype, device)
        speaker = SpeakerEncoder.from_checkpoint(config.speaker_encoder, tensors)
        codec = load_codec_encoder(directory / SPEECH_TOKENIZER_DIR, device=device)
        return cls(config, speaker, codec, TextTokenizer.from_dir(directory))

    def make_prompt(self, samples: np.ndarray | torch.Tensor, sample_rate: int, ref_text: str | None,
                    x_vector_only: bool) -> VoicePrompt:
        """A voice prompt from mono (or [n, channels]) samples at `sample_rate`. In-context mode (`x_vector_only`
        False) needs the transcript `ref_text`. Raises `ReferenceAudioError` for unusable input."""
        if not x_vector_only and (ref_text is None or not ref_text.strip()):
            raise ReferenceAudioError("ref_text_required", "in-context cloning needs ref_text, the transcript of the "
                                      "reference audio; or set x_vector_only_mode to clone from the voice alone")
        audio = mono_samples(samples)
        check_reference(audio.shape[0], sample_rate)
        stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), stream:
            prompt = self._compute(audio, sample_rate, None if x_vector_only else ref_text)
        if self._stream is not None:
            self._stream.synchronize()
        return prompt

    def _compute(self, audio: torch.Tensor, sample_rate: int, ref_text: str | None) -> VoicePrompt:
        audio = audio.to(self.device)
        at_speaker_rate = resample(audio, sample_rate, self.speaker_rate)
        weight = self.speaker_encoder.fc.weight
        mels = self.mel(at_speaker_rate)[None].to(weight.dtype)
        speaker = self.speaker_encoder(mels)[0].float().cpu()
        if ref_text is None:
            return VoicePrompt(speaker_embedding=speaker)
        codes = self.codec_encoder.encode(resample(audio, sample_rate, self.codec_encoder.sample_rate)).cpu()
        ids = self.tokenizer.encode(reference_text(ref_text))[REF_ROLE_TOKENS:-REF_TAIL_TOKENS]
        return VoicePrompt(speaker_embedding=speaker, ref_codes=codes, ref_text_ids=tuple(ids))

