"""AAC-LC in ADTS (`response_format: "aac"`), encoded by FFmpeg's native `aac` encoder and muxed by its `adts` muxer
through PyAV (`av`, whose wheels carry both).

ADTS is a stream of self-describing frames with no file header, so a streamed answer is the whole file: the encoder
takes s16 mono frames of any length (PyAV re-frames them into AAC's 1,024 samples), and the muxer hands each ADTS
frame on as soon as it is made (`flush_packets`), so the bytes do not wait in FFmpeg's I/O buffer. However the audio
is cut into pieces, the encoder sees the same 1,024-sample frames, so streamed and whole answers are the same bytes.
"""

from __future__ import annotations

import av
import numpy as np

MAX_KBPS = 64  # mono speech; the same as mp3's
MAX_BITS_PER_SAMPLE = 6  # AAC-LC's ceiling for one channel (6,144 bits a 1,024-sample frame): caps low rates


def bit_rate(sample_rate: int) -> int:
    """The encoder's target bits per second at `sample_rate`."""
    return min(MAX_KBPS * 1000, MAX_BITS_PER_SAMPLE * sample_rate)


class _Sink:
    """A write-only file for FFmpeg's muxer: keeps what it is given until taken."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def write(self, data: bytes) -> int:
        self._pending += data
        return len(data)

    def seekable(self) -> bool:
        return False  # ADTS never seeks back: tell FFmpeg so

    def take(self) -> bytes:
        ready = bytes(self._pending)
        self._pending.clear()
        return ready


class AacEncoder:
    """One stream of s16le mono PCM at `sample_rate` as AAC-LC in ADTS (a StreamEncoder)."""

    def __init__(self, sample_rate: int) -> None:
        self._sink = _Sink()
        self._rate = sample_rate
        self._container = av.open(self._sink, "w", format="adts", container_options={"flush_packets": "1"})
        self._stream = self._container.add_stream("aac", rate=sample_rate, layout="mono")
        self._stream.bit_rate = bit_rate(sample_rate)

    def feed(self, pcm: bytes) -> bytes:
        """The ADTS frames the encoder has made so far (it holds back up to a frame and its look-ahead)."""
        if pcm:
            frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16",
                                               layout="mono")
            frame.sample_rate = self._rate
            self._mux(frame)
        return self._sink.take()

    def finish(self) -> bytes:
        """Flush the encoder; the stream's last frames."""
        self._mux(None)
        self._container.close()
        return self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
