"""The keyed Gumbel noise of `sampling.sample` as one Triton kernel on CUDA.

Each draw's noise is a pure function of (row key, codebook, vocab id): two rounds of a 32-bit integer hash, a
uniform in (0, 1), then -log(-log(u)) in float64. Written with int64 tensor operations (the hash's multiplies
emulated in 16-bit halves) that is some fifty launches per codebook, sixteen codebooks per frame; here it is one.
The integer hash is exact in either form, so the kernel's draws are the torch expression's; off CUDA the torch
expression serves, and the CPU tests check the kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.model.triton_support import tl, triton

HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
"""The mixer's multipliers ('lowbias32'), as `sampling._hash32` uses them; passed as arguments so that the
kernel sees them as 64-bit values, never as a signed 32-bit literal."""



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

    @triton.jit
    def _gumbel_kernel(keys_ptr, ids_ptr, out_ptr, salt_a, salt_b, first, second, num_cols, stride_keys, stride_lane,
                       stride_ids, stride_out, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < num_cols
        lane_a = tl.load(keys_ptr + row * stride_keys).to(tl.uint32) ^ salt_a.to(tl.uint32)
        lane_b = tl.load(keys_ptr + row * stride_keys + stride_lane).to(tl.uint32) ^ salt_b.to(tl.uint32)
        ids = tl.load(ids_ptr + row * stride_ids + cols, mask=inside, other=0).to(tl.uint32)
        bits = _hash32(_hash32(lane_a ^ ids, first, second) ^ lane_b, first, second)
        uniform = (bits.to(tl.float64) + 0.5) / 4294967296.0
        tl.store(out_ptr + row * stride_out + cols, -tl.log(-tl.log(uniform)), mask=inside)


def keyed_gumbel(keys: torch.Tensor, salts: tuple[int, int], ids: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """float64 [B, K] noise for vocab ids [B, K] of rows keyed by keys [B, 2] (two 32-bit lanes in int64), with
    the codebook's two salts."""
    rows, num_cols = ids.shape
    out = torch.empty((rows, num_cols), dtype=torch.float64, device=ids.device)
    if rows and num_cols:
        block = min(block, triton.next_power_of_2(num_cols))
        _gumbel_kernel[(rows, triton.cdiv(num_cols, block))](
            keys, ids, out, salts[0], salts[1], HASH_MULTIPLIERS[0], HASH_MULTIPLIERS[1], num_cols, keys.stride(0),
            keys.stride(1), ids.stride(0), out.stride(0), BLOCK=block)
    return out
