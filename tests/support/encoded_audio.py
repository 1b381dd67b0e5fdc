"""Audio of a known shape in every response format, written with the libraries the gateway's encoders use (a
stand-in for the gateway's answers in the bench's and `voxmesh say`'s tests). No tests here."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile

from services.gateway.http.wav import wav_header
from services.gateway.requests.g711 import compand

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
    """`pcm` in `response_format` at `rate`, as a streamed answer carries it."""
    if response_format == "pcm":
        return pcm.tobytes()
    if response_format == "wav":
        return wav_header(STREAMED_WAV_SAMPLES, rate) + pcm.tobytes()
    if response_format in ("ulaw", "alaw"):
        return compand(pcm, response_format)
    if response_format == "mp3":
        return _by_ffmpeg(pcm, rate, "mp3", "libmp3lame")
    if response_format == "aac":
        return _by_ffmpeg(pcm, rate, "adts", "aac")
    out = io.BytesIO()
    soundfile.write(out, pcm, rate, format={"flac": "FLAC", "opus": "OGG"}[response_format],
                    subtype={"flac": "PCM_16", "opus": "OPUS"}[response_format])
    return out.getvalue()


def _by_ffmpeg(pcm: np.ndarray, rate: int, container_format: str, codec: str) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return out.getvalue()
