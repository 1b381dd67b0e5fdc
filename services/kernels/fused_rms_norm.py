"""RMSNorm as one Triton kernel on CUDA: the reference's numerics (float32 statistics, cast back to the input's
dtype, then the weight multiply in that dtype) in one pass instead of eight launches.

A norm is small work and many launches: the code predictor runs 21 of them per codebook, 315 per frame, and a
graph replay still pays each launch. Off CUDA the torch expression in `layers.RMSNorm` stays the path; the CPU
tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.skinny_linear import SplitSum
from services.kernels.triton_support import tl, triton


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


if triton is not None:

    @triton.jit
    def _store_sum_and_norm(x, delta, row, cols, inside, weight_ptr, sum_ptr, out_ptr, stride_sum, stride_out,
                            num_cols, eps):
        """x + delta (float32 rows, delta already in the model dtype's values) stored as the residual stream, then
        its RMSNorm: each rounded as the torch operations round them."""
        dtype = out_ptr.dtype.element_ty
        total = (x + delta).to(dtype)  # the residual stream, rounded as torch's add rounds it
        tl.store(sum_ptr + row * stride_sum + cols, total, mask=inside)
        total = total.to(tl.float32)
        mean_square = tl.sum(total * total, axis=0) / num_cols
        normed = (total * tl.rsqrt(mean_square + eps)).to(dtype).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (weight * normed).to(dtype), mask=inside)

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, stride_x, stride_delta, stride_sum,
                             stride_out, num_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < num_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        delta = tl.load(delta_ptr + row * stride_delta + cols, mask=inside, other=0.0).to(tl.float32)
        _store_sum_and_norm(x, delta, row, cols, inside, weight_ptr, sum_ptr, out_ptr, stride_sum, stride_out,
                            num_cols, eps)

    @triton.jit
    def _add_split_rms_norm_kernel(x_ptr, partial_ptr, weight_ptr, sum_ptr, out_ptr, stride_x, stride_partial,
                                   stride_split, stride_sum, stride_out, num_cols, eps, SPLITS: tl.constexpr,
                                   BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < num_cols
        delta = tl.zeros((BLOCK,), dtype=tl.float32)
        for split in tl.static_range(SPLITS):
            delta += tl.load(partial_ptr + split * stride_split + row * stride_partial + cols, mask=inside, other=0.0)
        delta = delta.to(out_ptr.dtype.element_ty).to(tl.float32)  # the projection's output, rounded as a GEMM's
        x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        _store_sum_and_norm(x, delta, row, cols, inside, weight_ptr, sum_ptr, out_ptr, stride_sum, stride_out,
                            num_cols, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | SplitSum, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`total = x + delta` (the residual add) and `rms_norm(total, weight, eps)` in one launch, each value as the two
    torch operations give it: a layer's residual add and the next norm read the row once instead of twice, two
    launches fewer a layer (150 a frame in the code predictor). Returns (total, normed).

    `delta` may be a projection's partial sums (`skinny_linear.SplitSum`): they are added and rounded here first."""
    if weight.dtype != x.dtype or delta.dtype != x.dtype or delta.shape != x.shape:
        raise ValueError(f"add_rms_norm needs x, delta and the weight in one dtype and x and delta of one shape, got "
                         f"{x.dtype} {tuple(x.shape)}, {delta.dtype} {tuple(delta.shape)} and {weight.dtype}")
    num_cols = x.shape[-1]
    rows = x.reshape(-1, num_cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    total, out = torch.empty_like(rows), torch.empty_like(rows)
    common = (total.stride(0), out.stride(0), num_cols, eps)
    block = triton.next_power_of_2(num_cols)
    if isinstance(delta, SplitSum):
        partials = delta.partials
        _add_split_rms_norm_kernel[(rows.shape[0],)](rows, partials, weight, total, out, rows.stride(0),
                                                     partials.stride(1), partials.stride(0), *common,
                                                     SPLITS=partials.shape[0], BLOCK=block)
    else:
        deltas = delta.reshape(-1, num_cols)
        if deltas.stride(-1) != 1:
            deltas = deltas.contiguous()
        _add_rms_norm_kernel[(rows.shape[0],)](rows, deltas, weight, total, out, rows.stride(0), deltas.stride(0),
                                               *common, BLOCK=block)
    return total.view(x.shape), out.view(x.shape)
