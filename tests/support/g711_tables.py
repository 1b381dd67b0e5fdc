"""G.711 decoders written for the tests from the standard's expansion rules (independent of the gateway's encoder
tables): a mu-law or A-law byte back to its 16-bit value."""

from __future__ import annotations

import numpy as np


def mulaw_decoded(code: int) -> int:
    """The 16-bit value of a mu-law byte: bits inverted; 3 segment bits, 4 step bits, biased by 0x84."""
    inverted = ~code & 0xFF
    magnitude = (((inverted & 0x0F) << 3) + 0x84) << ((inverted & 0x70) >> 4)
    return 0x84 - magnitude if inverted & 0x80 else magnitude - 0x84


def alaw_decoded(code: int) -> int:
    """The 16-bit value of an A-law byte: even bits inverted; segment 0 is linear, each later one doubles."""
    toggled = code ^ 0x55
    segment, step = (toggled & 0x70) >> 4, (toggled & 0x0F) << 4
    magnitude = step + 8 if segment == 0 else (step + 0x108) << (segment - 1)
    return magnitude if toggled & 0x80 else -magnitude


DECODERS = {"ulaw": mulaw_decoded, "alaw": alaw_decoded}


def decode(data: bytes, law: str) -> np.ndarray:
    """G.711 `law` bytes as 16-bit values (int32)."""
    table = np.array([DECODERS[law](code) for code in range(256)], dtype=np.int32)
    return table[np.frombuffer(data, dtype=np.uint8)]
