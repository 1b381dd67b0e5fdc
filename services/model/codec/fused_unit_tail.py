"""A residual unit's tail as one Triton kernel on CUDA: `x + conv2(SnakeBeta(h + b1)) + b2`, conv2 being 1x1.

A vocoder residual unit ends with SnakeBeta over its dilated convolution's output h (that convolution's bias b1
added first), a 1x1 convolution, its bias b2 and the residual x. Fused only pass by pass (`ResidualUnit._fused`),
that is three launches and seven passes over an activation at audio rate: the activation read and written, the
convolution read and written, the sum reading both and writing one. On the H200 the 1x1 convolution alone took 382 us
of a 64 x 8 codec call in each of the last block's three units (96 channels x 15,360 samples x 64 streams, 189 MB an
activation: its read and write are 90 us; `loadtest/gpu/codec_ops_bench.py`, 2026-12-02). A 1x1 convolution over a
[B, C, T] activation is the matrix product of its [B*T, C] rows with the weight, so here one kernel reads h and x once
and writes the result once: each program computes SnakeBeta on its rows of h as it loads them (the operand of its
products), multiplies them by the weight on the tensor cores, and adds b2 and x to the products before the store.

Rounding follows the pass-by-pass form: h + b1 and SnakeBeta's result rounded to the dtype (the convolution's
operand), the products accumulated in float32 and rounded (the convolution's output), then each sum rounded as the
bias kernel rounds it. The accumulation order differs from cuDNN's, so the two agree to the dtype's precision, not
bit for bit. Off by default until the card has timed it (`VOXMESH_FUSED_UNIT_TAIL=1` switches it on); off CUDA the
pass-by-pass form serves; the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import os

import torch

from services.model.codec import layout
from services.model.triton_support import dot_precision, tl, triton

SWITCHED_ON = os.environ.get("VOXMESH_FUSED_UNIT_TAIL", "0") == "1"
"""`VOXMESH_FUSED_UNIT_TAIL=1`: residual units end in this kernel where it serves (off until timed on the card)."""

BLOCK_ROWS = 64
"""Rows (batch x samples) a program owns."""
MAX_CHANNELS = 1024
"""Widest unit served: the kernel unrolls its reduction over the channels (the released codec's units have 96-768)."""

if triton is not None:

    @triton.jit
    def _unit_tail_kernel(h_ptr, x_ptr, weight_ptr, bias1_ptr, alpha_ptr, beta_ptr, bias2_ptr, out_ptr, num_rows,
                          length, stride_hb, stride_hc, stride_ht, stride_xb, stride_xc, stride_xt,
                          stride_ob, stride_oc, stride_ot, epsilon, CHANNELS: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        # The width a constant: one compilation a unit width (four in the released codec), its loop unrolled.
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_in, col_in = rows < num_rows, cols < CHANNELS
        batch, sample = rows // length, rows % length
        sums = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, CHANNELS, BLOCK_K):
            inner = start + tl.arange(0, BLOCK_K)
            inner_in = inner < CHANNELS
            h = tl.load(h_ptr + batch[:, None] * stride_hb + sample[:, None] * stride_ht + inner[None, :] * stride_hc,
                        mask=row_in[:, None] & inner_in[None, :], other=0.0)
            shifted = (h.to(tl.float32) + tl.load(bias1_ptr + inner, mask=inner_in, other=0.0).to(tl.float32)[None, :])
            shifted = shifted.to(h.dtype).to(tl.float32)  # rounded as the separate bias add would round it
            alpha = tl.exp(tl.load(alpha_ptr + inner, mask=inner_in, other=0.0).to(tl.float32))
            inverse_beta = 1.0 / (tl.exp(tl.load(beta_ptr + inner, mask=inner_in, other=0.0).to(tl.float32))
                                  + epsilon)
            wave = tl.sin(shifted * alpha[None, :])
            activated = (shifted + inverse_beta[None, :] * wave * wave).to(h.dtype)  # the convolution's operand
            # weight [C_out, C_in]: this tile as [BLOCK_K inputs, BLOCK_N outputs]
            weight = tl.load(weight_ptr + cols[None, :] * CHANNELS + inner[:, None],
                             mask=inner_in[:, None] & col_in[None, :], other=0.0).to(h.dtype)
            sums = tl.dot(activated, weight, sums, input_precision=PRECISION)
        out_type = out_ptr.dtype.element_ty
        product = sums.to(out_type).to(tl.float32)  # the convolution's output, rounded
        bias2 = tl.load(bias2_ptr + cols, mask=col_in, other=0.0).to(tl.float32)
        total = (product + bias2[None, :]).to(out_type).to(tl.float32)
        inside = row_in[:, None] & col_in[None, :]
        residual = tl.load(x_ptr + batch[:, None] * stride_xb + sample[:, None] * stride_xt + cols[None, :] * stride_xc,
                           mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + batch[:, None] * stride_ob + sample[:, None] * stride_ot + cols[None, :] * stride_oc,
                 (residual + total).to(out_type), mask=inside)


def serves(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *biases: torch.Tensor | None) -> bool:
    """Whether `unit_tail` takes this unit: switched on, a square 1x1 weight of at most MAX_CHANNELS, both biases,
    h and x of one shape [B, C, T] that the fused kernels read (`layout.readable`)."""
    channels = weight.shape[0]
    return (SWITCHED_ON and weight.dim() == 3 and weight.shape[1:] == (channels, 1)
            and channels <= MAX_CHANNELS and all(b is not None for b in biases)
            and h.shape == x.shape and h.shape[1] == channels and layout.readable(h) and layout.readable(x))


def unit_tail(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias1: torch.Tensor, log_alpha: torch.Tensor,
              log_beta: torch.Tensor, bias2: torch.Tensor, epsilon: float) -> torch.Tensor:
    """`x + conv2(SnakeBeta(h + bias1)) + bias2` for h, x [B, C, T] (dense samples or dense channels), conv2's weight
    [C, C, 1], SnakeBeta's per-channel log alpha and log beta [C]: a new tensor in x's layout."""
    for name, tensor in (("h", h), ("x", x)):
        if not layout.readable(tensor):
            raise ValueError(f"unit_tail needs {name} [B, C, T] with dense samples or dense channels, got shape "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")
    channels = weight.shape[0]
    if h.shape != x.shape or h.shape[1] != channels or tuple(weight.shape) != (channels, channels, 1):
        raise ValueError(f"unit_tail needs h and x [B, {channels}, T] alike and a [C, C, 1] weight, got h "
                         f"{tuple(h.shape)}, x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    out = layout.empty_as(x)
    if out.numel() == 0:
        return out
    batch, _, length = x.shape
    block_n = min(128, max(16, triton.next_power_of_2(channels)))
    block_k = 32 if channels % 32 == 0 else 16
    grid = (triton.cdiv(batch * length, BLOCK_ROWS), triton.cdiv(channels, block_n))
    _unit_tail_kernel[grid](h, x, weight.reshape(channels, channels).contiguous(), bias1, log_alpha, log_beta, bias2,
                            out, batch * length, length, *h.stride(), *x.stride(), *out.stride(), epsilon,
                            CHANNELS=channels, BLOCK_M=BLOCK_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
                            PRECISION=dot_precision(h.dtype))
    return out
