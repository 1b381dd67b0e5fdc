"""G.711 (ITU-T) telephony audio: 8 kHz, one byte a sample, mu-law (`ulaw`) or A-law (`alaw`), headerless.

The model's 24 kHz PCM is resampled to 8 kHz by libsoxr (`soxr`, its HQ filter) as a stream: each piece is
resampled as it comes, the resampler keeping the filter's history between pieces, and `finish` flushes the filter's
tail. In float32 libsoxr's streamed output equals its one-call output of the whole signal, so a streamed answer and
a whole one carry the same bytes, and the same audio always gives the same bytes. Each resampled sample is rounded to
16 bits, then companded by a 65,536-entry table built once from the standard's segment rule (mu-law: 14-bit
magnitude plus a bias of 33, 8 segments of 16 steps, bits inverted; A-law: 13-bit magnitude, 8 segments, even
bits inverted).
"""

from __future__ import annotations

import numpy as np
import soxr

G711_RATE = 8000
RESAMPLER_QUALITY = "HQ"
_FULL_SCALE = 32768.0
_MULAW_CLIP = 8158  # the largest 14-bit magnitude whose biased value (plus 33) stays in segment 7
_MULAW_BIAS = 33


def _segment_of(magnitude: np.ndarray) -> np.ndarray:
    """The bit length of each non-negative magnitude (0 for 0)."""
    return np.frexp(magnitude.astype(np.float64))[1].astype(np.int32)


def _mulaw_table() -> np.ndarray:
    value = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14 bits
    negative = value < 0
    magnitude = np.minimum(np.where(negative, -value, value), _MULAW_CLIP) + _MULAW_BIAS  # 33..8191
    segment = _segment_of(magnitude) - 6  # 33..63 is segment 0, 4096..8191 segment 7
    mantissa = (magnitude >> (segment + 1)) & 0x0F
    mask = np.where(negative, 0x7F, 0xFF)
    return (((segment << 4) | mantissa) ^ mask).astype(np.uint8)


def _alaw_table() -> np.ndarray:
    value = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13 bits
    negative = value < 0
    magnitude = np.where(negative, -value - 1, value)  # 0..4095
    segment = np.maximum(_segment_of(magnitude) - 5, 0)  # 0..31 is segment 0, 2048..4095 segment 7
    mantissa = (magnitude >> np.where(segment < 2, 1, segment)) & 0x0F
    mask = np.where(negative, 0x55, 0xD5)
    return (((segment << 4) | mantissa) ^ mask).astype(np.uint8)


# The byte of every 16-bit sample, indexed by the sample's bits read as unsigned (two's complement order).
_TABLES = {"ulaw": np.roll(_mulaw_table(), -32768), "alaw": np.roll(_alaw_table(), -32768)}
LAWS = tuple(_TABLES)


def compand(samples: np.ndarray, law: str) -> bytes:
    """int16 `samples` as G.711 bytes of `law` ("ulaw" or "alaw")."""
    return _TABLES[law][samples.astype(np.int16).view(np.uint16)].tobytes()


class G711Encoder:
    """One stream of s16le mono PCM at `in_rate` as G.711 `law` bytes at 8 kHz (a StreamEncoder)."""

    def __init__(self, law: str, in_rate: int) -> None:
        if law not in _TABLES:
            raise ValueError(f"unknown G.711 law {law!r}; one of {', '.join(LAWS)}")
        self._law = law
        self._resampler = soxr.ResampleStream(in_rate, G711_RATE, 1, dtype="float32", quality=RESAMPLER_QUALITY)

    def feed(self, pcm: bytes) -> bytes:
        """The bytes of the next PCM that the resampler's filter has let through (a few ms stay in it)."""
        if not pcm:
            return b""
        floats = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / _FULL_SCALE
        return self._encoded(self._resampler.resample_chunk(floats, last=False))

    def finish(self) -> bytes:
        """The filter's tail: the stream's last bytes."""
        return self._encoded(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))

    def _encoded(self, floats: np.ndarray) -> bytes:
        samples = np.clip(np.rint(floats.astype(np.float64) * _FULL_SCALE), -32768, 32767).astype(np.int16)
        return compand(samples, self._law)
