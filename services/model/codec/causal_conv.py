"""Causal convolutions that stream: each keeps the input history its kernel reaches back to.

A full decode pads each causal convolution with zeros on the left; a stream starts from a
zero history instead, then carries the last inputs over from chunk to chunk, so every
output sample sees exactly the inputs it would see in a full decode.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from services.model.codec.stream_state import StreamRows


class StreamingConv(nn.Module):
    """Base of the streaming convolutions: `history_slot` is assigned by the decoder."""

    history_len: int
    in_channels: int

    def __init__(self) -> None:
        super().__init__()
        self.history_slot: int | None = None

    def _with_history(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """Prepend the stored history to `x` and store the new tail for the next chunk."""
        if self.history_len == 0:
            return x
        full = torch.cat([stream.conv_histories[self.history_slot], x], dim=-1)
        stream.conv_histories[self.history_slot] = stream.keep(full[..., full.shape[-1] - self.history_len :])
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
        full = self._with_history(x, stream)
        if full.is_cuda and self.conv.out_channels < NARROW_OUTPUTS and self.conv.groups == 1:
            return _padded_outputs(self.conv, full)
        return self.conv(full)


NARROW_OUTPUTS = 8
"""Convolutions with fewer output channels run with their weight zero-padded to this many on CUDA: cuDNN gives the
vocoder's last conv (96 -> 1 channel, k=7, at 24 kHz) a generic implicit-GEMM kernel that took 5.9 of a graphed
codec call's 41.6 ms on the H200 (64 streams x 8 frames); with 8 outputs it takes a tensor-core kernel
(loadtest/gpu/codec_ops_bench.py times both). The padded outputs are zeros plus bias and are dropped."""


def _padded_outputs(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    pad = NARROW_OUTPUTS - conv.out_channels
    weight = F.pad(conv.weight, (0, 0, 0, 0, 0, pad))
    bias = None if conv.bias is None else F.pad(conv.bias, (0, pad))
    out = F.conv1d(x, weight, bias, stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    return out[:, : conv.out_channels]


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
        num_new = x.shape[-1]
        y = self.conv(self._with_history(x, stream))
        start = self.history_len * self.stride
        return y[..., start : start + num_new * self.stride]
