"""The two memory layouts a vocoder activation [B, C, T] takes on CUDA, and the tiles the fused kernels read them in.

Samples dense (stride 1 on T, torch's default) is what torch's 1-D convolutions make; channels dense (stride 1 on C,
"channels-last") is what cuDNN's fast convolution kernels read and write, so an activation kept channels-dense skips
the two transposes cuDNN otherwise adds around every convolution. The
fused kernels read either; a program's tile runs along whichever axis is dense, so its loads stay coalesced.
"""

from __future__ import annotations

import torch

from services.kernels.triton_support import tl, triton

TILE = 1024
"""Elements a fused kernel's program handles."""
CHANNEL_TILE = 64
"""Channels a program reads side by side when channels are dense (64 bf16 values: two 64-byte segments)."""


def channels_dense(x: torch.Tensor) -> bool:
    """[B, C, T] held channels-last: stride 1 on C, C on T (a transposed view of a dense [B, T, C])."""
    return x.dim() == 3 and x.shape[1] > 1 and x.stride(1) == 1 and (x.shape[2] == 1 or x.stride(2) == x.shape[1])


def readable(x: torch.Tensor) -> bool:
    """Whether the fused kernels read `x`: [B, C, T] with dense samples or dense channels."""
    return x.dim() == 3 and (x.stride(-1) == 1 or channels_dense(x))


def empty_as(x: torch.Tensor, shape: tuple[int, int, int] | None = None) -> torch.Tensor:
    """An empty [B, C, T] tensor (x's shape unless given) in x's layout: channels-last when x is, else contiguous."""
    batch, channels, length = shape or tuple(x.shape)
    if channels_dense(x):
        return torch.empty((batch, length, channels), dtype=x.dtype, device=x.device).transpose(1, 2)
    return torch.empty((batch, channels, length), dtype=x.dtype, device=x.device)


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """x [B, C, T] held channels-last (x itself when it already is)."""
    return x if channels_dense(x) else x.transpose(1, 2).contiguous().transpose(1, 2)


def tile(x: torch.Tensor) -> tuple[int, int]:
    """(rows, samples) of a program's tile over x [B, C, T]: rows are batch * channels + channel, consecutive channels
    side by side when they are dense, else one row's samples; short rows share a program."""
    channels, length = x.shape[1], x.shape[2]
    if channels_dense(x):
        rows = min(CHANNEL_TILE, triton.next_power_of_2(channels))
        return rows, TILE // rows
    block = min(TILE, triton.next_power_of_2(length))
    return TILE // block, block


if triton is not None:

    @triton.jit
    def program_tile(num_rows, channels, length, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """This program's tile, as `tile` sized it: (batch, channel) of its ROWS rows, its BLOCK sample offsets, which
        rows exist, which elements exist."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # batch * channels + channel
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        row_inside = rows < num_rows
        inside = row_inside[:, None] & (offsets < length)[None, :]
        return rows // channels, rows % channels, offsets, row_inside, inside

    @triton.jit
    def tile_offsets(batch, channel, offsets, stride_b, stride_c, stride_t):
        """Element offsets of a tile in a tensor of these strides."""
        return (batch * stride_b + channel * stride_c)[:, None] + offsets[None, :] * stride_t
