"""Frame-rate upsampling before the vocoder: per ratio, a causal transposed conv + ConvNeXt block.

Names mirror the checkpoint: `upsample.N.0.conv` (transposed conv) and
`upsample.N.1.{dwconv.conv, norm, pwconv1, pwconv2, gamma}` (ConvNeXt).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from services.model.codec.causal_conv import CausalConv1d, CausalConvTranspose1d
from services.model.codec.config import CodecConfig
from services.model.codec.stream_state import StreamRows


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv, LayerNorm, pointwise MLP (GELU), scaled residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """[B, C, n] -> [B, C, n]."""
        h = self.dwconv(x, stream).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


def build_upsampler(config: CodecConfig) -> nn.ModuleList:
    """One [transposed conv, ConvNeXt] pair per entry of `upsampling_ratios`."""
    dim = config.latent_dim
    return nn.ModuleList(
        nn.ModuleList([CausalConvTranspose1d(dim, dim, ratio, ratio), ConvNeXtBlock(dim)])
        for ratio in config.upsampling_ratios
    )


def run_upsampler(stages: nn.ModuleList, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
    """[B, latent, n] -> [B, latent, n * prod(upsampling_ratios)]."""
    for transposed, convnext in stages:
        x = convnext(transposed(x, stream), stream)
    return x
