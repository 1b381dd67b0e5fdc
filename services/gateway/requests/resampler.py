"""The model's audio at another sample rate: s16le mono PCM resampled by libsoxr (`soxr`, its HQ filter) as a stream.

Each piece is resampled as it comes, the resampler keeping the filter's history between pieces, and `finish` flushes
the filter's tail (a few ms). In float32 libsoxr's streamed output equals its one-call output of the whole signal
bit for bit, however the pieces are cut, so a streamed answer and a whole one carry the same samples, and the same
audio always gives the same bytes. The output of one piece depends on every piece before it, so a stream that must
reproduce its bytes from the middle (a WebSocket resume) replays the audio from its start through a fresh resampler
and drops what it had sent (ws/session.py). Each output sample is rounded to 16 bits.

At the same rate in and out there is no resampler: the PCM passes through untouched, with no tail.
"""

from __future__ import annotations

import numpy as np
import soxr

RESAMPLER_QUALITY = "HQ"
_FULL_SCALE = 32768.0


class PcmResampler:
    """One stream of s16le mono PCM at `in_rate` as s16le mono PCM at `out_rate`."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream: soxr.ResampleStream | None = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=RESAMPLER_QUALITY)

    @property
    def is_identity(self) -> bool:
        """Whether the PCM passes through unchanged (the same rate in and out)."""
        return self._stream is None

    def feed(self, pcm: bytes) -> bytes:
        """The resampled PCM that the filter has let through so far (a few ms stay in it)."""
        if self._stream is None or not pcm:
            return pcm
        floats = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / _FULL_SCALE
        return _to_pcm(self._stream.resample_chunk(floats, last=False))

    def finish(self) -> bytes:
        """The filter's tail: the stream's last PCM (empty without a resampler)."""
        if self._stream is None:
            return b""
        return _to_pcm(self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True))


def resampled(pcm: bytes, in_rate: int, out_rate: int) -> bytes:
    """The whole of `pcm` at `out_rate`: the bytes a stream of the same audio gives, however it was cut."""
    resampler = PcmResampler(in_rate, out_rate)
    return resampler.feed(pcm) + resampler.finish()


def _to_pcm(floats: np.ndarray) -> bytes:
    samples = np.clip(np.rint(floats.astype(np.float64) * _FULL_SCALE), -32768, 32767).astype("<i2")
    return samples.tobytes()
