"""`sampling.row_keys` in one Triton launch (`sampling.row_keys_into` takes it on CUDA): each row's two 32-bit hash lanes of (seed, frame).

The torch form is ~100 elementwise operations on a [B] tensor (the 32-bit multiplies emulated in 16-bit halves);
inside the sampling graph each would be a kernel of its own, and on the host the numpy form costs a few hundred
microseconds a step. Here every row is one program: the same three fields, salts and mixer rounds, in uint32, so the
keys are equal to the bit.
"""

from __future__ import annotations

import torch

from services.kernels import fused_gumbel
from services.kernels.triton_support import tl, triton

if triton is not None:

    @triton.jit
    def _lane(lane_seed, seed_low, seed_high, frame, salt_low, salt_high, salt_frame, first, second):
        state = lane_seed.to(tl.uint32)
        state = fused_gumbel._hash32(state ^ seed_low ^ salt_low.to(tl.uint32), first, second)
        state = fused_gumbel._hash32(state ^ seed_high ^ salt_high.to(tl.uint32), first, second)
        return fused_gumbel._hash32(state ^ frame ^ salt_frame.to(tl.uint32), first, second)

    @triton.jit
    def _row_keys_kernel(seed_ptr, frame_ptr, out_ptr, rows, stride_seed, stride_frame, stride_out, stride_lane,
                         lane_a, lane_b, salt_low, salt_high, salt_frame, first, second, BLOCK: tl.constexpr):
        index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = index < rows
        seed = tl.load(seed_ptr + index * stride_seed, mask=inside, other=0)
        frame = tl.load(frame_ptr + index * stride_frame, mask=inside, other=0)
        # The int64 fields as `sampling._key_lanes` masks them: low and high halves of the seed, the frame's low half.
        seed_low = (seed & 0xFFFFFFFF).to(tl.uint32)
        seed_high = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        frame_low = (frame & 0xFFFFFFFF).to(tl.uint32)
        key_a = _lane(lane_a, seed_low, seed_high, frame_low, salt_low, salt_high, salt_frame, first, second)
        key_b = _lane(lane_b, seed_low, seed_high, frame_low, salt_low, salt_high, salt_frame, first, second)
        tl.store(out_ptr + index * stride_out, key_a.to(tl.int64), mask=inside)
        tl.store(out_ptr + index * stride_out + stride_lane, key_b.to(tl.int64), mask=inside)


def row_keys(seed: torch.Tensor, frame: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B, 2], equal to `sampling.row_keys(seed, frame)` (on the CPU only under Triton's interpreter). seed and
    frame: int64 [B], any stride; `out`: where to write them (int64 [B, 2], any strides, e.g. two columns of a wider
    table), returned."""
    rows = int(seed.shape[0])
    if out is None:
        out = torch.empty((rows, 2), dtype=torch.int64, device=seed.device)
    if rows == 0:
        return out
    block = 64
    _row_keys_kernel[(triton.cdiv(rows, block),)](
        seed, frame, out, rows, seed.stride(0), frame.stride(0), out.stride(0), out.stride(1),
        *fused_gumbel.LANE_SEEDS, *fused_gumbel.FIELD_SALTS[:3], *fused_gumbel.HASH_MULTIPLIERS, BLOCK=block)
    return out
