"""G.711 (ITU-T) telephony audio: one byte a sample, mu-law (`ulaw`) or A-law (`alaw`), headerless; 8 kHz unless
the client asks for another rate.

The model's 24 kHz PCM is first resampled to the answer's rate (requests/resampler.py, the same for every format);
each 16-bit sample is then companded by a 65,536-entry table built once from the standard's segment rule (mu-law:
14-bit magnitude plus a bias of 33, 8 segments of 16 steps, bits inverted; A-law: 13-bit magnitude, 8 segments, even
bits inverted).
"""

from __future__ import annotations

import numpy as np

G711_RATE = 8000  # the telephony rate: a G.711 answer's rate when the client names none
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
    """One stream of s16le mono PCM as G.711 `law` bytes at the same rate (a StreamEncoder)."""

    def __init__(self, law: str) -> None:
        if law not in _TABLES:
            raise ValueError(f"unknown G.711 law {law!r}; one of {', '.join(LAWS)}")
        self._law = law

    def feed(self, pcm: bytes) -> bytes:
        """One byte for each sample of `pcm`."""
        return compand(np.frombuffer(pcm, dtype="<i2"), self._law)

    def finish(self) -> bytes:
        """Nothing: companding keeps no state."""
        return b""
