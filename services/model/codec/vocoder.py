"""The SEANet-style vocoder: latent frames -> 24 kHz samples, every convolution causal.

Layout (names mirror the checkpoint's `decoder.decoder.N...`): an input conv (k=7), one
block per upsample rate [SnakeBeta, transposed conv (k=2r, stride r), 3 residual units with
dilations 1, 3, 9], then SnakeBeta and an output conv (k=7) to one channel.
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.codec import fused_snake
from services.model.codec.causal_conv import CausalConv1d, CausalConvTranspose1d
from services.model.codec.config import CodecConfig
from services.model.codec.stream_state import StreamRows
from services.model.triton_support import compiles_for

_RESIDUAL_DILATIONS = (1, 3, 9)
# Guards 1 / exp(beta) against division by zero, as the reference does.
_SNAKE_EPSILON = 1e-9


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (alpha, beta stored as logs)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, stream: StreamRows | None = None) -> torch.Tensor:
        if compiles_for(x.device) and x.dim() == 3 and x.stride(-1) == 1:
            return fused_snake.snake_beta(x, self.alpha, self.beta, _SNAKE_EPSILON)  # one launch, not five
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + _SNAKE_EPSILON)) * torch.sin(x * alpha).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        h = self.conv1(self.act1(x), stream)
        return x + self.conv2(self.act2(h), stream)


class VocoderBlock(nn.Module):
    """Upsample by `rate` and halve the channels, then refine with residual units."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate)]
        layers += [ResidualUnit(out_dim, dilation) for dilation in _RESIDUAL_DILATIONS]
        self.block = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, stream)
        return x


def build_vocoder(config: CodecConfig) -> nn.ModuleList:
    """The `decoder.decoder` module list, in checkpoint order."""
    layers: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, kernel_size=7)]
    for index, rate in enumerate(config.upsample_rates):
        layers.append(VocoderBlock(config.decoder_dim // 2**index, config.decoder_dim // 2 ** (index + 1), rate))
    out_dim = config.decoder_dim // 2 ** len(config.upsample_rates)
    layers += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, kernel_size=7)]
    return nn.ModuleList(layers)


def run_vocoder(layers: nn.ModuleList, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
    """[B, latent, m] -> [B, m * prod(upsample_rates)] samples clamped to [-1, 1]."""
    for layer in layers:
        x = layer(x, stream)
    return x.squeeze(1).clamp(min=-1.0, max=1.0)
