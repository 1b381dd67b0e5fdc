"""The keyed Gumbel noise's integer hash in Triton, for the fused draw (`fused_draw.py`).

Each draw's noise is a pure function of (row key, codebook, vocab id): two rounds of a 32-bit integer hash, a
uniform in (0, 1), then -log(-log(u)) in float64. The hash is exact here as in `sampling._hash32` (int64 tensor
operations, the multiplies emulated in 16-bit halves), so the fused draw's noise is the torch form's.
"""

from __future__ import annotations

from services.kernels.triton_support import tl, triton

HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
"""The mixer's multipliers ('lowbias32'), as `sampling._hash32` uses them; passed as arguments so that the
kernel sees them as 64-bit values, never as a signed 32-bit literal."""
LANE_SEEDS = (0x9E3779B9, 0x85EBCA6B)
"""Distinct odd constants that decorrelate the two hash lanes of a row key (`sampling.row_keys`)."""
FIELD_SALTS = (0x27D4EB2F, 0x165667B1, 0xC2B2AE3D, 0x61C88647)
"""Distinct odd constants that decorrelate the fields of a key (seed low, seed high, frame; codebook)."""



if triton is not None:

    @triton.jit
    def _mul32(x, constant):
        # x * constant mod 2**32, in uint64 so that no signed promotion can change the low 32 bits.
        return (x.to(tl.uint64) * constant.to(tl.uint64)).to(tl.uint32)

    @triton.jit
    def _hash32(x, first, second):
        x = x ^ (x >> 16)
        x = _mul32(x, first)
        x = x ^ (x >> 15)
        x = _mul32(x, second)
        return x ^ (x >> 16)
