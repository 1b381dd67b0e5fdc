"""The vocoder's dilated causal convolutions as one Triton implicit-GEMM kernel on CUDA.

A residual unit's k=7 dilated convolution is most of the codec's device time, and cuDNN's channels-last kernels
stay far from the device's peak on it. The convolution is a matrix product whose operand rows are the input
shifted by each tap: output row (b, t) = sum over taps j of input row (b, t + j * dilation) times the tap's
[C_in, C_out] weight. Here a program owns BLOCK_M output rows and BLOCK_N output channels, and for each tap loads
its rows of the input (channels dense, so each row is one contiguous read) and the tap's weight tile, and
accumulates their products on the tensor cores in float32; the input's rows are read once per tap, from L2 after
the first.

The input is the convolution's buffer with its history in front (`StreamingConv._with_history_written`), so the
streaming logic is untouched. The weight is laid out tap-major ([taps, C_in, C_out]) per call, a copy of a few MB, as
`causal_conv.channels_last_weight` does for cuDNN. The model takes it on CUDA where the `triton_conv` setting allows
(on by default); the CPU tests check it under Triton's interpreter.

It serves where it beats cuDNN's channels-last kernels (`loadtest/gpu/codec_ops_bench.py` times both): the 384-,
192- and 96-channel units and the output conv; the first block's 768-channel units stay with cuDNN (`MAX_CHANNELS`),
as do the latent-rate convs (the GEMM form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.kernels.codec import layout
from services.kernels.triton_support import dot_precision, tl, triton


@dataclass(frozen=True, slots=True)
class ConvTile:
    """A launch shape: output rows and channels a program owns, input channels a step of its reduction."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    num_warps: int = 8
    num_stages: int = 3


MAX_CHANNELS = 384
"""Input channels above this stay with cuDNN (see the module's note)."""


def tile_for(c_in: int, c_out: int) -> ConvTile:
    """The launch shape for a conv of these channels: 64-channel reduction steps where the inputs are many (fewer
    loop steps), 32 for the last block's 96 (a 64-channel step would be two-thirds padding), narrow columns for the
    one-channel output conv (a wide tile would be nearly all padding)."""
    if c_out < 16:
        return ConvTile(block_m=128, block_n=64, block_k=32, num_warps=4)
    return ConvTile(block_k=32 if c_in <= 96 else 64)


if triton is not None:

    @triton.jit
    def _conv_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, num_rows, length, stride_xb, stride_xc, stride_xt,
                     stride_ob, stride_oc, stride_ot, C_IN: tl.constexpr, C_OUT: tl.constexpr, TAPS: tl.constexpr,
                     DILATION: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr, PRECISION: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_in, col_in = rows < num_rows, cols < C_OUT
        batch, sample = rows // length, rows % length  # output sample t reads inputs t .. t + (TAPS - 1) * DILATION
        sums = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # One loop over (tap, input-channel step) pairs, not two nested ones: the compiler pipelines the innermost
        # loop's loads, and a unit's 96-768 input channels are only 3-24 steps a tap.
        for step in range(0, TAPS * K_STEPS):
            tap, start = step // K_STEPS, (step % K_STEPS) * BLOCK_K
            inner = start + tl.arange(0, BLOCK_K)
            inner_in = inner < C_IN
            inputs = tl.load(x_ptr + (batch * stride_xb + (sample + tap * DILATION) * stride_xt)[:, None]
                             + inner[None, :] * stride_xc, mask=row_in[:, None] & inner_in[None, :], other=0.0)
            # weight, tap-major [TAPS, C_IN, C_OUT]: this tap's [BLOCK_K inputs, BLOCK_N outputs]
            weights = tl.load(weight_ptr + (tap * C_IN + inner[:, None]) * C_OUT + cols[None, :],
                              mask=inner_in[:, None] & col_in[None, :], other=0.0)
            sums = tl.dot(inputs, weights, sums, input_precision=PRECISION)
        if HAS_BIAS:
            sums += tl.load(bias_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + batch[:, None] * stride_ob + sample[:, None] * stride_ot + cols[None, :] * stride_oc,
                 sums.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])


def serves(full: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """Whether `causal_conv` takes this convolution (whether it may is the caller's choice: the `triton_conv`
    setting): ungrouped, more than one tap, at most `MAX_CHANNELS`
    input channels, an input buffer the fused kernels read (`layout.readable`), channels that match."""
    return (groups == 1 and weight.dim() == 3 and weight.shape[2] > 1 and full.dim() == 3
            and full.shape[1] == weight.shape[1] <= MAX_CHANNELS and layout.readable(full))


def causal_conv(full: torch.Tensor, weight: torch.Tensor, dilation: int, bias: torch.Tensor | None = None,
                tile: ConvTile | None = None) -> torch.Tensor:
    """The convolution of `full` [B, C_in, H + n] (its history H = (taps - 1) * dilation in front) with `weight`
    [C_out, C_in, taps] (+ `bias` [C_out]): [B, C_out, n] in full's layout, launched in `tile` (`tile_for` the
    channels when None)."""
    if not layout.readable(full):
        raise ValueError(f"causal_conv needs full [B, C, T] with dense samples or dense channels, got shape "
                         f"{tuple(full.shape)} strides {full.stride()}")
    c_out, c_in, taps = weight.shape
    tile = tile or tile_for(c_in, c_out)
    history = (taps - 1) * dilation
    if full.shape[1] != c_in or full.shape[2] < history:
        raise ValueError(f"causal_conv needs full [B, {c_in}, >= {history}] for a {tuple(weight.shape)} weight at "
                         f"dilation {dilation}, got {tuple(full.shape)}")
    batch, length = full.shape[0], full.shape[2] - history
    out = layout.empty_as(full, (batch, c_out, length))
    if out.numel() == 0:
        return out
    tap_major = weight.permute(2, 1, 0).contiguous()  # [taps, C_in, C_out]
    block_n = min(tile.block_n, max(16, triton.next_power_of_2(c_out)))
    block_k = min(tile.block_k, max(16, triton.next_power_of_2(c_in)))
    grid = (triton.cdiv(batch * length, tile.block_m), triton.cdiv(c_out, block_n))
    _conv_kernel[grid](full, tap_major, tap_major if bias is None else bias, out, batch * length, length,
                       *full.stride(), *out.stride(), C_IN=c_in, C_OUT=c_out, TAPS=taps, DILATION=dilation,
                       HAS_BIAS=bias is not None, BLOCK_M=tile.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                       K_STEPS=triton.cdiv(c_in, block_k), PRECISION=dot_precision(full.dtype),
                       num_warps=tile.num_warps, num_stages=tile.num_stages)
    return out
