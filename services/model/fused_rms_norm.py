"""RMSNorm as one Triton kernel on CUDA: the reference's numerics (float32 statistics, cast back to the input's
dtype, then the weight multiply in that dtype) in one pass instead of eight launches.

A norm is small work and many launches: the code predictor runs 21 of them per codebook, 315 per frame, and a
graph replay still pays each launch. Off CUDA the torch expression in `layers.RMSNorm` stays the path; the CPU
tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.model.triton_support import tl, triton


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, stride_x, stride_out, num_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < num_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) / num_cols
        # As the reference: normalise in float32, round to the input dtype, multiply by the weight in that dtype.
        normed = (x * tl.rsqrt(mean_square + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=inside)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)` over the last dimension, statistics in float32."""
    if weight.dtype != x.dtype:
        raise ValueError(f"rms_norm needs the weight in the input's dtype, got {weight.dtype} and {x.dtype}")
    num_cols = x.shape[-1]
    rows = x.reshape(-1, num_cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty_like(rows)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), num_cols, eps,
                                       BLOCK=triton.next_power_of_2(num_cols))
    return out.view(x.shape)
