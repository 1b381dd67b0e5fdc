"""SnakeBeta as one Triton kernel on CUDA: `x + sin(x * e^alpha)^2 / (e^beta + eps)` in one read and one write.

The torch form is five launches over the whole activation (a broadcast multiply that takes torch's slow generic
elementwise path, the sine, the square, the scale, the add), and the vocoder runs 29 activations at audio rate: on
the H200 they were 40% of a graphed codec call (64 streams x 8 frames: 16.5 of 41.6 ms,
`loadtest/gpu/gpu_codec_slots.py`'s kernel table). Here each element is read once and the arithmetic is float32,
rounded once to the activation's dtype (the torch form rounds after every step in bf16, so the two agree to the
dtype's precision, not bit for bit; the codec's parity criterion is in tests/test_codec_parity.py). Off CUDA the
torch form in `vocoder.SnakeBeta` serves; the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.model.triton_support import tl, triton

BLOCK = 1024
"""Samples of one channel row a program handles."""

if triton is not None:

    @triton.jit
    def _snake_kernel(x_ptr, alpha_ptr, beta_ptr, out_ptr, channels, length, stride_xb, stride_xc, stride_ob,
                      stride_oc, epsilon, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # batch * channels + channel
        block = tl.program_id(1)
        batch, channel = row // channels, row % channels
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < length
        x = tl.load(x_ptr + batch * stride_xb + channel * stride_xc + offsets, mask=inside, other=0.0)
        x = x.to(tl.float32)
        alpha = tl.exp(tl.load(alpha_ptr + channel).to(tl.float32))
        inverse_beta = 1.0 / (tl.exp(tl.load(beta_ptr + channel).to(tl.float32)) + epsilon)
        wave = tl.sin(x * alpha)
        y = x + inverse_beta * wave * wave
        tl.store(out_ptr + batch * stride_ob + channel * stride_oc + offsets, y.to(out_ptr.dtype.element_ty),
                 mask=inside)


def snake_beta(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, epsilon: float) -> torch.Tensor:
    """SnakeBeta of x [B, C, T] (samples dense: stride 1 on T) with per-channel log alpha and log beta [C]."""
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(f"snake_beta needs [B, C, T] with dense samples, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")
    batch, channels, length = x.shape
    out = torch.empty((batch, channels, length), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    grid = (batch * channels, triton.cdiv(length, BLOCK))
    _snake_kernel[grid](x, log_alpha, log_beta, out, channels, length, x.stride(0), x.stride(1), out.stride(0),
                        out.stride(1), epsilon, BLOCK=BLOCK)
    return out
