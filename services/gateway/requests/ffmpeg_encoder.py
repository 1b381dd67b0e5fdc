"""The compressed response formats, encoded and muxed by FFmpeg through PyAV (`av`, whose wheels carry every codec
and muxer used here): one path for mp3 (LAME, `libmp3lame`), opus (`libopus` in Ogg), flac and aac (FFmpeg's native
AAC-LC, in ADTS).

The encoder takes s16 mono frames of any length (PyAV re-frames them into each codec's frame size), so however the
audio is cut into pieces the codec sees the same frames: streamed and whole answers carry the same audio. The muxer
hands each packet on as soon as it is made (`flush_packets`; Ogg closes a page per packet), so a stream's bytes do not
wait in FFmpeg's buffers, and it writes no tool version or random serial (`+bitexact`), so the same audio always gives
the same bytes. A stream's sink cannot seek, so what a muxer would rewrite at the end stays as first written: a
streamed flac's STREAMINFO says "length unknown" (total samples 0, no MD5, as FLAC allows); a whole file's sink can
seek, so it gets the exact values. An mp3 is plain CBR frames with no Xing frame or ID3 tag (a Xing frame is rewritten
at the end, which a stream cannot take back), so a streamed mp3 is the whole one.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

try:  # optional at import: without it these formats are refused with a clear error instead of the gateway not starting
    import av
except ImportError:  # pragma: no cover - av is a pinned dependency
    av = None

MP3_KBPS = 64  # constant bit rate of mp3: transparent enough for mono speech
AAC_MAX_KBPS = 64  # mono speech, as mp3
AAC_MAX_BITS_PER_SAMPLE = 6  # AAC-LC's ceiling for one channel (6,144 bits a 1,024-sample frame): caps low rates


@dataclass(frozen=True, slots=True)
class FfmpegFormat:
    """How FFmpeg makes one response format.

    Attributes:
        codec: FFmpeg's encoder.
        muxer: FFmpeg's container format.
        bit_rate: bits per second at a sample rate (None: the codec's own choice; lossless codecs have none).
        muxer_options: besides those every format gets (packets flushed as made, bit-exact output).
        codec_options: the encoder's options.
    """

    codec: str
    muxer: str
    bit_rate: Callable[[int], int | None] = lambda rate: None
    muxer_options: dict[str, str] = field(default_factory=dict)
    codec_options: dict[str, str] = field(default_factory=dict)


FFMPEG_FORMATS: dict[str, FfmpegFormat] = {
    # LAME's quality 2 (near-best, still far faster than real time); constant bit rate, no Xing frame, no ID3 tag.
    "mp3": FfmpegFormat("libmp3lame", "mp3", lambda rate: MP3_KBPS * 1000,
                        {"write_xing": "0", "id3v2_version": "0"}, {"compression_level": "2"}),
    "opus": FfmpegFormat("libopus", "ogg", muxer_options={"page_duration": "1"}),  # one page a packet: sent as made
    "flac": FfmpegFormat("flac", "flac"),
    "aac": FfmpegFormat("aac", "adts", lambda rate: min(AAC_MAX_KBPS * 1000, AAC_MAX_BITS_PER_SAMPLE * rate)),
}
_EVERY_MUXER = {"flush_packets": "1", "fflags": "+bitexact"}


@functools.cache
def is_available(name: str) -> bool:
    """Whether PyAV is installed and its FFmpeg has the encoder and the muxer of format `name` (builds without them
    exist)."""
    fmt = FFMPEG_FORMATS[name]
    if av is None or fmt.muxer not in av.formats_available:
        return False
    try:
        av.codec.Codec(fmt.codec, "w")
    except Exception:  # noqa: BLE001 - PyAV raises its own error kinds for a missing codec
        return False
    return True


class _StreamSink:
    """A write-only file that cannot seek: keeps what the muxer writes until taken."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def write(self, data: bytes) -> int:
        self._pending += data
        return len(data)

    def seekable(self) -> bool:
        return False

    def take(self) -> bytes:
        ready = bytes(self._pending)
        self._pending.clear()
        return ready


class FfmpegEncoder:
    """One file of s16le mono PCM at `sample_rate` in format `name` (a StreamEncoder). `whole`: the encoder makes a
    complete file, its header rewritten at the end (feed returns nothing; finish returns the file)."""

    def __init__(self, name: str, sample_rate: int, *, whole: bool = False) -> None:
        fmt = FFMPEG_FORMATS[name]
        self._rate = sample_rate
        self._whole = io.BytesIO() if whole else None
        self._sink = _StreamSink()
        self._container = av.open(self._whole if self._whole is not None else self._sink, "w", format=fmt.muxer,
                                  container_options={**_EVERY_MUXER, **fmt.muxer_options})
        self._stream = self._container.add_stream(fmt.codec, rate=sample_rate, layout="mono",
                                                  options=dict(fmt.codec_options))
        bit_rate = fmt.bit_rate(sample_rate)
        if bit_rate is not None:
            self._stream.bit_rate = bit_rate

    def feed(self, pcm: bytes) -> bytes:
        """The bytes the muxer has written so far (the codec holds back up to a frame and its look-ahead)."""
        if pcm:
            frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16",
                                               layout="mono")
            frame.sample_rate = self._rate
            self._mux(frame)
        return self._sink.take()

    def finish(self) -> bytes:
        """Flush the codec and close the file; its last bytes (a whole file: all of it)."""
        self._mux(None)
        self._container.close()
        return self._whole.getvalue() if self._whole is not None else self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)


def encode_file(name: str, pcm: bytes, sample_rate: int) -> bytes:
    """A complete file of s16le mono `pcm` in format `name`, with exact lengths in its header."""
    encoder = FfmpegEncoder(name, sample_rate, whole=True)
    encoder.feed(pcm)
    return encoder.finish()
