"""A voice prompt as stored in the VOICES object store (`SavedVoice`) or handed from prefill to decode (`ReadyVoice`),
and back: tensors as little-endian bytes."""

from __future__ import annotations

import time

import numpy as np
import torch

from messages.voice_clone import ReadyVoice, SavedVoice
from services.model.voice.cloner import TextEncoder
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.voice_prompt import REF_ROLE_TOKENS, REF_TAIL_TOKENS, VoicePrompt, reference_text


def saved_voice(prompt: VoicePrompt, *, name: str, model: str, duration_s: float, ref_text: str | None) -> SavedVoice:
    codes = prompt.ref_codes
    return SavedVoice(
        name=name, model=model, created_at=time.time(), duration_s=duration_s, x_vector_only=not prompt.in_context,
        ref_text=ref_text if prompt.in_context else None,
        speaker_embedding=prompt.speaker_embedding.float().numpy().astype("<f4").tobytes(),
        ref_codes=None if codes is None else codes.numpy().astype("<i2").tobytes(),
        num_codebooks=int(codes.shape[1]) if codes is not None else 16,
    )


def voice_prompt(record: SavedVoice, tokenizer: TextEncoder) -> VoicePrompt:
    """The prompt of a saved voice; its transcript is tokenized again here (ids are cheap; text is what it saved)."""
    embedding = _embedding(record.speaker_embedding)
    if record.x_vector_only or record.ref_codes is None or record.ref_text is None:
        return VoicePrompt(speaker_embedding=embedding)
    ids = tokenizer.encode(reference_text(record.ref_text))[REF_ROLE_TOKENS:-REF_TAIL_TOKENS]
    return VoicePrompt(speaker_embedding=embedding, ref_codes=_codes(record.ref_codes, record.num_codebooks),
                       ref_text_ids=tuple(ids))


def ready_voice(prompt: VoicePrompt) -> ReadyVoice:
    """What a prefill replica hands to decode with a cloned request: the prompt it computed, as it is."""
    codes = prompt.ref_codes
    return ReadyVoice(speaker_embedding=prompt.speaker_embedding.float().numpy().astype("<f4").tobytes(),
                      ref_codes=None if codes is None else codes.numpy().astype("<i2").tobytes(),
                      num_codebooks=int(codes.shape[1]) if codes is not None else 16,
                      ref_text_ids=None if prompt.ref_text_ids is None else list(prompt.ref_text_ids))


def ready_prompt(record: ReadyVoice) -> VoicePrompt:
    """The prompt a prefill replica handed over (raises ReferenceAudioError for an inconsistent one)."""
    codes = None if record.ref_codes is None else _codes(record.ref_codes, record.num_codebooks)
    ids = None if record.ref_text_ids is None else tuple(record.ref_text_ids)
    return VoicePrompt(speaker_embedding=_embedding(record.speaker_embedding), ref_codes=codes, ref_text_ids=ids)


def _embedding(data: bytes) -> torch.Tensor:
    if not data or len(data) % 4:
        raise ReferenceAudioError("invalid_voice_prompt", f"a speaker embedding of {len(data)} bytes is no float32 "
                                  "vector")
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())


def _codes(data: bytes, num_codebooks: int) -> torch.Tensor:
    if len(data) % (2 * num_codebooks):
        raise ReferenceAudioError("invalid_voice_prompt", f"{len(data)} bytes of reference codes are no whole "
                                  f"frames of {num_codebooks} int16 codes")
    return torch.from_numpy(np.frombuffer(data, dtype="<i2").astype(np.int64)).view(-1, num_codebooks)
