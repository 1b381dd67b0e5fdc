"""SnakeBeta as one Triton kernel on CUDA: `x + sin(x * e^alpha)^2 / (e^beta + eps)` in one read and one write.

The torch form is five launches over the whole activation (a broadcast multiply that takes torch's slow generic
elementwise path, the sine, the square, the scale, the add), and the vocoder runs 29 activations at audio rate, a
large share of a graphed codec call (`loadtest/gpu/gpu_codec_slots.py`'s kernel table). Here each element is read once and the arithmetic is float32,
rounded once to the activation's dtype (the torch form rounds after every step in bf16, so the two agree to the
dtype's precision, not bit for bit; the codec's parity criterion is in tests/unit/test_codec_parity.py). Off CUDA the
torch form in `vocoder.SnakeBeta` serves; the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.codec import layout
from services.kernels.triton_support import tl, triton

if triton is not None:

    @triton.jit
    def _snake_kernel(x_ptr, alpha_ptr, beta_ptr, bias_ptr, out_ptr, num_rows, channels, length, stride_xb,
                      stride_xc, stride_xt, stride_ob, stride_oc, stride_ot, epsilon, ROWS: tl.constexpr,
                      BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
        batch, channel, offsets, row_inside, inside = layout.program_tile(num_rows, channels, length, ROWS, BLOCK)
        x = tl.load(x_ptr + layout.tile_offsets(batch, channel, offsets, stride_xb, stride_xc, stride_xt), mask=inside,
                    other=0.0).to(tl.float32)
        if HAS_BIAS:  # the bias of the convolution before, added here instead of in a pass of its own
            bias = tl.load(bias_ptr + channel, mask=row_inside, other=0.0).to(tl.float32)
            x = (x + bias[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
        alpha = tl.exp(tl.load(alpha_ptr + channel, mask=row_inside, other=0.0).to(tl.float32))
        inverse_beta = 1.0 / (tl.exp(tl.load(beta_ptr + channel, mask=row_inside, other=0.0).to(tl.float32))
                              + epsilon)
        wave = tl.sin(x * alpha[:, None])
        y = x + inverse_beta[:, None] * wave * wave
        tl.store(out_ptr + layout.tile_offsets(batch, channel, offsets, stride_ob, stride_oc, stride_ot),
                 y.to(out_ptr.dtype.element_ty), mask=inside)


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, epsilon: float, *,
               bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """SnakeBeta of x [B, C, T] (dense samples or dense channels: `layout.readable`) with per-channel log alpha and
    log beta [C], into a new tensor of x's layout.

    `bias` [C]: SnakeBeta of x + bias (the sum rounded to x's dtype first, as the separate add would), so the
    convolution before can skip its own bias pass. `out`: where to write instead (a readable [B, C, T] view, such as
    the part after a streaming convolution's history in its input buffer)."""
    for name, tensor in (("x", x), ("out", out)):
        if tensor is not None and not layout.readable(tensor):
            raise ValueError(f"snake_beta needs {name} [B, C, T] with dense samples or dense channels, got shape "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")
    if out is None:
        out = layout.empty_as(x)
    elif out.shape != x.shape:
        raise ValueError(f"snake_beta writes x's shape {tuple(x.shape)}, out is {tuple(out.shape)}")
    if out.numel() == 0:
        return out
    batch, channels, length = x.shape
    rows, block = layout.tile(x)
    grid = (triton.cdiv(batch * channels, rows), triton.cdiv(length, block))
    _snake_kernel[grid](x, log_alpha, log_beta, log_alpha if bias is None else bias, out, batch * channels, channels,
                        length, *x.stride(), *out.stride(), epsilon, ROWS=rows, BLOCK=block,
                        HAS_BIAS=bias is not None)
    return out
