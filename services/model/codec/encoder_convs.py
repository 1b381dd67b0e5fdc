"""The codec encoder's convolutional front end (a SEANet encoder): 24 kHz samples -> hidden frames at 25 Hz.

Every convolution is causal: it pads `(kernel - 1) * dilation + 1 - stride` samples on the left, and on the right
only what makes the length a whole number of strides, so output frame t sees inputs up to its own window's end.
Layer indices follow the checkpoint (`encoder.encoder.layers.N`): activations hold no weights but take an index.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from services.model.codec.encoder_config import CodecEncoderConfig


class PaddedCausalConv(nn.Module):
    """Conv1d with causal padding (`conv` holds the weights); `pad_mode` "constant" pads zeros, "replicate" the
    edge sample."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.left = (kernel - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        right = -(-length // self.stride) * self.stride - length
        return self.conv(F.pad(x, (self.left, right), mode=self.pad_mode))


class ResidualBlock(nn.Module):
    """ELU, dilated conv to a narrower width, ELU, 1x1 conv back; added to the input (or a 1x1 shortcut of it).
    `block.1` and `block.3` are the checkpoint's names of the two convolutions."""

    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([
            nn.ELU(), PaddedCausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
            nn.ELU(), PaddedCausalConv(hidden, dim, 1),
        ])
        self.shortcut = PaddedCausalConv(dim, dim, 1) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return self.shortcut(x) + y


class SeanetEncoder(nn.Module):
    """Input conv; per ratio (finest first): residual blocks, ELU, a strided conv doubling the channels; then ELU
    and the output conv to `hidden_size`."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [PaddedCausalConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        width = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                layers.append(ResidualBlock(cfg, width, cfg.dilation_growth_rate**j))
            layers += [nn.ELU(), PaddedCausalConv(width, width * 2, ratio * 2, stride=ratio)]
            width *= 2
        layers += [nn.ELU(), PaddedCausalConv(width, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, samples: torch.Tensor) -> torch.Tensor:
        """[B, channels, n] -> [B, hidden, ceil(n / stride)]."""
        x = samples
        for layer in self.layers:
            x = layer(x)
        return x
