"""A convolution's bias (and the residual after it) as one Triton pass on CUDA: `residual + (y + bias)`.

torch adds a cuDNN convolution's bias in a pass of its own, a broadcast over [B, C, 1, T] that takes torch's generic
elementwise path (a third of the bandwidth), and the residual add after it another (`loadtest/gpu/gpu_codec_slots.py`'s
op table shows their share of a codec call). Here the
convolution runs without its bias and this kernel adds it, with the residual when one follows, in one read of each
input and one write. Each sum is rounded to the dtype as the separate adds round it, so the result is the torch
form's, bit for bit. Off CUDA the torch form serves; the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.codec import layout
from services.kernels.triton_support import tl, triton

if triton is not None:

    @triton.jit
    def _bias_kernel(y_ptr, bias_ptr, residual_ptr, out_ptr, num_rows, channels, length, stride_yb, stride_yc,
                     stride_yt, stride_rb, stride_rc, stride_rt, stride_ob, stride_oc, stride_ot, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        batch, channel, offsets, row_inside, inside = layout.program_tile(num_rows, channels, length, ROWS, BLOCK)
        y = tl.load(y_ptr + layout.tile_offsets(batch, channel, offsets, stride_yb, stride_yc, stride_yt), mask=inside,
                    other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + channel, mask=row_inside, other=0.0).to(tl.float32)
        total = (y + bias[:, None]).to(out_ptr.dtype.element_ty)
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + layout.tile_offsets(batch, channel, offsets, stride_rb, stride_rc,
                                                                  stride_rt), mask=inside, other=0.0).to(tl.float32)
            total = (residual + total.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + layout.tile_offsets(batch, channel, offsets, stride_ob, stride_oc, stride_ot), total,
                 mask=inside)


def add_bias(y: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """`y + bias[None, :, None]`, then `residual + that` when given, as a new [B, C, T] tensor in y's layout (dense
    samples or dense channels: `layout.readable`; y may be a trimmed view, a transposed convolution's output)."""
    for name, tensor in (("y", y), ("residual", residual)):
        if tensor is not None and not layout.readable(tensor):
            raise ValueError(f"add_bias needs {name} [B, C, T] with dense samples or dense channels, got shape "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")
    if residual is not None and residual.shape != y.shape:
        raise ValueError(f"add_bias needs a residual of y's shape {tuple(y.shape)}, got {tuple(residual.shape)}")
    out = layout.empty_as(y)
    if out.numel() == 0:
        return out
    batch, channels, length = y.shape
    rows, block = layout.tile(y)
    grid = (triton.cdiv(batch * channels, rows), triton.cdiv(length, block))
    source = y if residual is None else residual
    _bias_kernel[grid](y, bias, source, out, batch * channels, channels, length, *y.stride(), *source.stride(),
                       *out.stride(), ROWS=rows, BLOCK=block, HAS_RESIDUAL=residual is not None)
    return out
