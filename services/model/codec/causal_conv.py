"""Causal convolutions that stream: each keeps the input history its kernel reaches back to.

A full decode pads each causal convolution with zeros on the left; a stream starts from a
zero history instead, then carries the last inputs over from chunk to chunk, so every
output sample sees exactly the inputs it would see in a full decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from services.kernels.codec import layout, triton_conv
from services.model.codec.stream_state import StreamRows
from services.kernels.triton_support import compiles_for

Writer = Callable[[torch.Tensor, torch.Tensor], object]
"""`write(x, out)`: puts an elementwise function of x into `out` (same shape, a view into a convolution's input)."""


def _copy(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x)


class StreamingConv(nn.Module):
    """Base of the streaming convolutions: `history_slot` is assigned by the decoder."""

    history_len: int
    in_channels: int

    def __init__(self) -> None:
        super().__init__()
        self.history_slot: int | None = None
        self.triton_conv = True
        """Whether the Triton convolution (`kernels.codec.triton_conv`) may serve this one on CUDA (the loader sets
        it from the `triton_conv` setting)."""

    def _with_history(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """Prepend the stored history to `x` and store the new tail for the next chunk."""
        if self.history_len == 0:
            return x
        return self._with_history_written(x, stream, _copy)

    def _with_history_written(self, x: torch.Tensor, stream: StreamRows, write: Writer) -> torch.Tensor:
        """The history, then f(x), in one buffer: `write(x, out)` puts f(x) straight after the history (the fused
        SnakeBeta before a convolution writes there, so its output is not copied again); the new tail is stored."""
        batch, channels, length = x.shape
        full = layout.empty_as(x, (batch, channels, self.history_len + length))
        if self.history_len:
            full[..., : self.history_len].copy_(stream.conv_histories[self.history_slot])
        write(x, full[..., self.history_len :])
        if self.history_len:
            stream.keep_history(self.history_slot, full, self.history_len)
        return full


class CausalConv1d(StreamingConv):
    """Stride-1 Conv1d that sees only the present and past (`conv` holds the weights)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.in_channels = in_channels
        self.history_len = (kernel_size - 1) * dilation

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """[B, C_in, n] -> [B, C_out, n]."""
        return self.convolve(self._with_history(x, stream))

    def forward_written(self, x: torch.Tensor, stream: StreamRows, write: Writer, *, bias: bool = True) -> torch.Tensor:
        """`forward(f(x))` where `write(x, out)` writes f(x) into `out` (see `_with_history_written`); `bias=False`
        leaves the bias out, for a fused kernel after it to add."""
        return self.convolve(self._with_history_written(x, stream, write), bias=bias)

    def convolve(self, full: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
        """The convolution over an input that already holds its history: [B, C_in, H + n] -> [B, C_out, n]."""
        conv = self.conv
        if full.is_cuda and conv.groups == 1 and full.shape[-1] - self.history_len <= GEMM_FORM_MAX_OUTPUTS:
            return _as_gemm(conv, full, bias=bias)
        if self.triton_conv and compiles_for(full.device) and triton_conv.serves(full, conv.weight, conv.groups):
            return triton_conv.causal_conv(full, conv.weight, conv.dilation[0], conv.bias if bias else None)
        if layout.channels_dense(full):
            return F.conv2d(full.unsqueeze(2), channels_last_weight(conv), conv.bias if bias else None,
                            dilation=(1, conv.dilation[0]), groups=conv.groups).squeeze(2)
        if bias:
            return conv(full)  # the module's call: its hooks see it (the random checkpoint calibrates on one)
        return F.conv1d(full, conv.weight, None, dilation=conv.dilation, groups=conv.groups)


GEMM_FORM_MAX_OUTPUTS = 64
"""Convolutions with at most this many outputs a row (the latent-rate ones: a chunk's few frames) run on CUDA as one
GEMM over their unfolded windows: with so few outputs the unfolded copy is small and the product runs on the tensor
cores, where cuDNN's kernels for such short rows spend more. On longer rows the copy grows with every tap and cuDNN's
kernels are the better choice, so they stay with it (`loadtest/gpu/codec_ops_bench.py` times both forms)."""


def _as_gemm(conv: nn.Conv1d, x: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
    """`conv(x)` for a stride-1, ungrouped, unpadded conv as unfold + one matrix product: [B, C_in, L] -> [B, C_out,
    L - (k - 1) * dilation] (without the bias when `bias` is False)."""
    taps, dilation = conv.kernel_size[0], conv.dilation[0]
    windows = x.unfold(2, (taps - 1) * dilation + 1, 1)[..., ::dilation]  # [B, C_in, T, taps], a view
    batch, _, length, _ = windows.shape
    columns = windows.permute(0, 2, 1, 3).reshape(batch * length, -1)  # [B*T, C_in*taps]: the one copy
    out = F.linear(columns, conv.weight.reshape(conv.out_channels, -1), conv.bias if bias else None)
    return out.view(batch, length, -1).transpose(1, 2)  # channels-last, as cuDNN's fast kernels read it next


def channels_last_weight(conv: nn.Conv1d | nn.ConvTranspose1d) -> torch.Tensor:
    """The conv's weight as a 2-D one held channels-last ([out, in, 1, k], or [in, out, 1, k] transposed), which makes
    cuDNN run its channels-last kernels with no transposes. A copy each call (the weights are a few MB; a cache keyed
    on the tensor's version cannot serve inference tensors, which keep none)."""
    return conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)


class CausalConvTranspose1d(StreamingConv):
    """ConvTranspose1d upsampling by `stride`, trimmed so frame t's output depends on inputs <= t.

    Input i writes outputs [i*stride, i*stride + kernel); the outputs of the new inputs,
    [H*stride, (H+n)*stride) of the extended input, are complete once the H previous inputs
    (H = ceil(kernel / stride) - 1) are prepended, and untouched by any later input.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.in_channels = in_channels
        self.stride = stride
        self.history_len = math.ceil(kernel_size / stride) - 1

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """[B, C_in, n] -> [B, C_out, n * stride]."""
        return self._trimmed(self.conv(self._with_history(x, stream)), x.shape[-1])

    def forward_written(self, x: torch.Tensor, stream: StreamRows, write: Writer, *, bias: bool = True) -> torch.Tensor:
        """`forward(f(x))` where `write(x, out)` writes f(x) into `out`; `bias=False` leaves the bias out. The result
        is a view (trimmed), with dense samples."""
        conv = self.conv
        full = self._with_history_written(x, stream, write)
        if layout.channels_dense(full):
            y = F.conv_transpose2d(full.unsqueeze(2), channels_last_weight(conv), conv.bias if bias else None,
                                   stride=(1, conv.stride[0])).squeeze(2)
        else:
            y = conv(full) if bias else F.conv_transpose1d(full, conv.weight, None, stride=conv.stride)
        return self._trimmed(y, x.shape[-1])

    def _trimmed(self, y: torch.Tensor, num_new: int) -> torch.Tensor:
        start = self.history_len * self.stride
        return y[..., start : start + num_new * self.stride]
