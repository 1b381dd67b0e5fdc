"""How s16le mono PCM becomes a speech response in its `response_format` (requests/response_formats.py says which
exist), either as one whole file or as a stream of bytes made while the audio is still being generated.

The model's 24 kHz audio is first brought to the answer's rate by requests/resampler.py (libsoxr as a stream: the
same samples streamed or whole; nothing at 24 kHz). wav and pcm are written here, ulaw and alaw by g711.py; flac and
opus (in Ogg) are encoded by libsndfile through `soundfile` (its wheels ship libsndfile with FLAC and
Opus); aac by FFmpeg through PyAV (aac.py: ADTS frames, the same bytes streamed or whole); mp3 by LAME through
`lameenc`, which writes plain CBR frames with no Xing header, so a streamed mp3 is the same as a whole one (libsndfile's mp3 writer rewrites a Xing frame at the start on close,
which a stream cannot take back).

Streamed files cannot know their length up front: a streamed wav carries the "unknown length" sizes (0xFFFFFFFF)
that streaming players accept; a streamed flac keeps the STREAMINFO written at the start (total samples 0 = unknown,
which the FLAC format allows) because the encoder's final rewrite of it would land on bytes already sent.
"""

from __future__ import annotations

import io
import struct
from typing import Protocol

import numpy as np
import soundfile

from messages.audio_format import CHANNELS
from services.gateway.http.aac import AacEncoder
from services.gateway.requests.g711 import LAWS, G711Encoder
from services.gateway.http.wav import BITS_PER_SAMPLE, wav_bytes
from services.gateway.requests.resampler import PcmResampler, resampled
from services.gateway.requests.response_formats import AudioFormat

UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data size of a WAV streamed before its length is known
MP3_KBPS = 64  # constant bit rate of mp3 output: transparent enough for 24 kHz mono speech
MP3_QUALITY = 2  # LAME's quality/speed trade-off (2: near-best, still far faster than real time)


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
    if fmt.name in ("mp3", "aac"):
        encoder = _encoder_at(fmt, rate)
        return encoder.feed(pcm) + encoder.finish()
    major, subtype = fmt.libsndfile  # type: ignore[misc]  # every other format is libsndfile's
    out = io.BytesIO()
    soundfile.write(out, np.frombuffer(pcm, dtype="<i2"), rate, format=major, subtype=subtype)
    return out.getvalue()


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
    if fmt.name == "mp3":
        return _Mp3Encoder(rate)
    if fmt.name == "aac":
        return AacEncoder(rate)
    return _SoundFileStreamEncoder(fmt, rate)


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


class _Mp3Encoder:
    def __init__(self, sample_rate: int) -> None:
        import lameenc  # here, not at the top: only made for mp3, which response_formats offers only with lameenc

        self._lame = lameenc.Encoder()
        self._lame.set_bit_rate(MP3_KBPS)
        self._lame.set_in_sample_rate(sample_rate)
        self._lame.set_out_sample_rate(sample_rate)  # LAME would pick its own output rate for the bit rate
        self._lame.set_channels(CHANNELS)
        self._lame.set_quality(MP3_QUALITY)
        self._has_audio = False

    def feed(self, pcm: bytes) -> bytes:
        if not pcm:
            return b""
        self._has_audio = True
        return bytes(self._lame.encode(pcm))

    def finish(self) -> bytes:
        return bytes(self._lame.flush()) if self._has_audio else b""  # LAME refuses to flush what never started


class _ForwardSink:
    """A file for libsndfile that hands bytes on as they are written. Writes that land on bytes already handed
    on (an encoder's final header rewrite) are dropped: those bytes left with the stream's start."""

    def __init__(self) -> None:
        self._sent = 0  # bytes handed on
        self._pending = bytearray()  # bytes after them, not handed on yet
        self._position = 0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        start, end = self._position, self._position + len(data)
        if end > self._sent:
            skip = max(0, self._sent - start)
            offset = start + skip - self._sent
            if offset + len(data) - skip > len(self._pending):
                self._pending.extend(b"\0" * (offset + len(data) - skip - len(self._pending)))
            self._pending[offset:offset + len(data) - skip] = data[skip:]
        self._position = end
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._sent + len(self._pending)}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        return b""  # a write-only stream: encoders never need their output back

    def take(self) -> bytes:
        """The bytes written since the last call."""
        ready = bytes(self._pending)
        self._sent += len(ready)
        self._pending.clear()
        return ready


class _SoundFileStreamEncoder:
    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        major, subtype = fmt.libsndfile  # type: ignore[misc]
        self._sink = _ForwardSink()
        self._file = soundfile.SoundFile(self._sink, mode="w", samplerate=sample_rate, channels=CHANNELS,
                                         format=major, subtype=subtype)

    def feed(self, pcm: bytes) -> bytes:
        if pcm:
            self._file.write(np.frombuffer(pcm, dtype="<i2"))
        return self._sink.take()

    def finish(self) -> bytes:
        self._file.close()
        return self._sink.take()
