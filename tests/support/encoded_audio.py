"""Audio of a known shape in every response format, written by the gateway's encoders or libsndfile (a
stand-in for the gateway's answers in the bench's and `voxmesh say`'s tests). No tests here."""

from __future__ import annotations

import io

import numpy as np
import soundfile

from services.gateway.http.encoders import stream_encoder
from services.gateway.http.wav import wav_header
from services.gateway.requests.g711 import compand
from services.gateway.requests.response_formats import audio_format

SILENT_S = 0.25  # the audio is silent this long, then a loud tone: the first audible sample is known
TONE_S = 1.0
MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "aac": "audio/aac",
               "opus": "audio/ogg", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}
STREAMED_WAV_SAMPLES = 0x7FFFFFF0 // 2  # a streamed WAV's header: a length no stream reaches


def signal(rate: int) -> np.ndarray:
    """SILENT_S of silence, then TONE_S of a 440 Hz tone at -8.7 dBFS, s16 at `rate`."""
    t = np.arange(int(rate * TONE_S)) / rate
    tone = (np.sin(2 * np.pi * 440 * t) * 12000).astype(np.int16)
    return np.concatenate([np.zeros(int(rate * SILENT_S), dtype=np.int16), tone])


def encode(response_format: str, pcm: np.ndarray, rate: int) -> bytes:
    """`pcm` in `response_format` at `rate`, as a streamed answer carries it: mp3 and aac by the gateway's own stream
    encoder (the bench must read what the gateway sends: mp3 without a Xing frame), flac and opus by libsndfile."""
    if response_format == "pcm":
        return pcm.tobytes()
    if response_format == "wav":
        return wav_header(STREAMED_WAV_SAMPLES, rate) + pcm.tobytes()
    if response_format in ("ulaw", "alaw"):
        return compand(pcm, response_format)
    if response_format in ("mp3", "aac"):
        encoder = stream_encoder(audio_format(response_format), rate)
        return encoder.feed(pcm.tobytes()) + encoder.finish()
    out = io.BytesIO()
    soundfile.write(out, pcm, rate, format={"flac": "FLAC", "opus": "OGG"}[response_format],
                    subtype={"flac": "PCM_16", "opus": "OPUS"}[response_format])
    return out.getvalue()
