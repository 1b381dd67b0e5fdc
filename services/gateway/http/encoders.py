"""How s16le mono PCM becomes a speech response in its `response_format` (requests/response_formats.py says which
exist), either as one whole file or as a stream of bytes made while the audio is still being generated.

The model's 24 kHz audio is first brought to the answer's rate by requests/resampler.py (libsoxr as a stream: the
same samples streamed or whole; nothing at 24 kHz). wav and pcm are written here, ulaw and alaw by g711.py; mp3,
opus, flac and aac by FFmpeg through PyAV (requests/ffmpeg_encoder.py), one path for the four.

Streamed files cannot know their length up front: a streamed wav carries the "unknown length" sizes (0xFFFFFFFF)
that streaming players accept; a streamed flac keeps the STREAMINFO written at the start (total samples 0 = unknown,
which the FLAC format allows) because the muxer's final rewrite of it would land on bytes already sent.
"""

from __future__ import annotations

import struct
from typing import Protocol

from messages.audio_format import CHANNELS
from services.gateway.http.wav import BITS_PER_SAMPLE, wav_bytes
from services.gateway.requests.ffmpeg_encoder import FfmpegEncoder, encode_file
from services.gateway.requests.g711 import LAWS, G711Encoder
from services.gateway.requests.resampler import PcmResampler, resampled
from services.gateway.requests.response_formats import AudioFormat

UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data size of a WAV streamed before its length is known


def encode_whole(fmt: AudioFormat, pcm: bytes, in_rate: int, out_rate: int | None = None) -> bytes:
    """A complete file of s16le mono `pcm` at `in_rate`, served at `out_rate` (None: `in_rate`), with exact lengths
    in its headers. CPU work: call it off the event loop for long audio in a compressed format or at another rate."""
    rate = in_rate if out_rate is None else out_rate
    pcm = resampled(pcm, in_rate, rate)
    if fmt.name == "pcm":
        return pcm
    if fmt.name == "wav":
        return wav_bytes(pcm, rate)
    if fmt.name in LAWS:
        return G711Encoder(fmt.name).feed(pcm)
    return encode_file(fmt.name, pcm, rate)


class StreamEncoder(Protocol):
    """Turns PCM pieces into the bytes of one streamed file, in order."""

    def feed(self, pcm: bytes) -> bytes:
        """Encode the next s16le mono PCM; returns the bytes ready to send (may be empty while a codec buffers)."""

    def finish(self) -> bytes:
        """Flush the codec; returns the file's last bytes."""


def stream_encoder(fmt: AudioFormat, in_rate: int, out_rate: int | None = None) -> StreamEncoder:
    """A fresh encoder of one streamed file in `fmt` of PCM at `in_rate`, served at `out_rate` (None: `in_rate`)."""
    rate = in_rate if out_rate is None else out_rate
    encoder = _encoder_at(fmt, rate)
    resampler = PcmResampler(in_rate, rate)
    return encoder if resampler.is_identity else _Resampled(resampler, encoder)


def _encoder_at(fmt: AudioFormat, rate: int) -> StreamEncoder:
    """An encoder of PCM already at the answer's `rate`."""
    if fmt.name == "pcm":
        return _RawEncoder()
    if fmt.name == "wav":
        return _WavStreamEncoder(rate)
    if fmt.name in LAWS:
        return G711Encoder(fmt.name)
    return FfmpegEncoder(fmt.name, rate)


class _Resampled:
    """An encoder fed through a resampler: the codec sees the audio at its own rate, and the filter's tail before
    the codec's own end."""

    def __init__(self, resampler: PcmResampler, encoder: StreamEncoder) -> None:
        self._resampler = resampler
        self._encoder = encoder

    def feed(self, pcm: bytes) -> bytes:
        return self._encoder.feed(self._resampler.feed(pcm))

    def finish(self) -> bytes:
        return self._encoder.feed(self._resampler.finish()) + self._encoder.finish()


def streaming_wav_header(sample_rate: int) -> bytes:
    """The 44-byte header of a WAV whose length is not known yet (sizes 0xFFFFFFFF)."""
    block_align = CHANNELS * BITS_PER_SAMPLE // 8
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, CHANNELS, sample_rate, sample_rate * block_align,
                                    block_align, BITS_PER_SAMPLE)
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


class _RawEncoder:
    def feed(self, pcm: bytes) -> bytes:
        return pcm

    def finish(self) -> bytes:
        return b""


class _WavStreamEncoder:
    def __init__(self, sample_rate: int) -> None:
        self._header: bytes | None = streaming_wav_header(sample_rate)

    def feed(self, pcm: bytes) -> bytes:
        header, self._header = self._header or b"", None
        return header + pcm

    def finish(self) -> bytes:
        return self.feed(b"")  # a stream with no audio still gets its header
