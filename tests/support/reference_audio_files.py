"""Reference recordings for the voice-cloning tests: a voiced-sounding tone as an audio file or a data URI."""

from __future__ import annotations

import base64
import io

import numpy as np
import soundfile


def tone(seconds: float, sample_rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """[samples, channels] float32: 180 Hz with harmonics and a little noise (each channel a different level)."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    voice = sum(0.25 / k * np.sin(2 * np.pi * 180 * k * t) for k in (1, 2, 3))
    voice = voice + 0.02 * np.random.default_rng(seed).standard_normal(t.shape)
    return np.stack([voice * (1.0 - 0.3 * c) for c in range(channels)], axis=1).astype(np.float32)


def audio_file(seconds: float, sample_rate: int = 24000, channels: int = 1, fmt: str = "WAV", seed: int = 0) -> bytes:
    out = io.BytesIO()
    subtype = "PCM_16" if fmt == "WAV" else None
    soundfile.write(out, tone(seconds, sample_rate, channels, seed), sample_rate, format=fmt, subtype=subtype)
    return out.getvalue()


def data_uri(data: bytes, media_type: str = "audio/wav") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def reference_uri(seconds: float = 2.0, sample_rate: int = 24000, channels: int = 1, seed: int = 0) -> str:
    return data_uri(audio_file(seconds, sample_rate, channels, seed=seed))
