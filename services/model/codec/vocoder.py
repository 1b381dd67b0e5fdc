"""The SEANet-style vocoder: latent frames -> 24 kHz samples, every convolution causal.

Layout (names mirror the checkpoint's `decoder.decoder.N...`): an input conv (k=7), one
block per upsample rate [SnakeBeta, transposed conv (k=2r, stride r), 3 residual units with
dilations 1, 3, 9], then SnakeBeta and an output conv (k=7) to one channel.
"""

from __future__ import annotations

import torch
from torch import nn

from services.kernels.codec import fused_bias, fused_snake, layout
from services.kernels.triton_support import compiles_for
from services.model.codec.causal_conv import CausalConv1d, CausalConvTranspose1d
from services.model.codec.config import CodecConfig
from services.model.codec.stream_state import StreamRows

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
        if compiles_for(x.device) and layout.readable(x):
            return fused_snake.snake_beta(x, self.alpha, self.beta, _SNAKE_EPSILON)  # one launch, not five
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + _SNAKE_EPSILON)) * torch.sin(x * alpha).pow(2)

    def write(self, x: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """The fused form only: SnakeBeta of x (+ `bias`, a convolution's left out) into `out`."""
        fused_snake.snake_beta(x, self.alpha, self.beta, _SNAKE_EPSILON, bias=bias, out=out)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        if _fuses(x):
            return self._fused(x, stream)
        h = self.conv1(self.act1(x), stream)
        return x + self.conv2(self.act2(h), stream)

    def _fused(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """The same sums in four passes over the activation and two convolutions: act1 writes into conv1's input
        buffer after its history (no concatenation), conv1's bias rides in act2, conv2's in the residual add."""
        h = self.conv1.forward_written(x, stream, self.act1.write, bias=False)
        return self.tail_in_passes(h, x)

    def tail_in_passes(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`x + conv2(act2(h + conv1's bias))` for conv1's output h without its bias, in three fused passes."""
        s = layout.empty_as(h)
        self.act2.write(h, s, bias=self.conv1.conv.bias)
        return _add_bias(self.conv2.convolve(s, bias=False), self.conv2.conv.bias, residual=x)


class VocoderBlock(nn.Module):
    """Upsample by `rate` and halve the channels, then refine with residual units."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate)]
        layers += [ResidualUnit(out_dim, dilation) for dilation in _RESIDUAL_DILATIONS]
        self.block = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        layers = list(self.block)
        if _fuses(x):  # the activation written into the transposed conv's input buffer, its bias added after
            snake, upsample = layers[0], layers[1]
            x = _add_bias(upsample.forward_written(x, stream, snake.write, bias=False), upsample.conv.bias)
            layers = layers[2:]
        for layer in layers:
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
    first, *body, snake, out_conv = layers
    x = first(x, stream)
    if _fuses(x):  # channels-last from here (a no-op where the input conv's GEMM form made it so)
        x = layout.channels_last(x)
    for layer in body:
        x = layer(x, stream)
    if _fuses(x):  # the last activation written into the output conv's input buffer
        x = out_conv.forward_written(x, stream, snake.write)
    else:
        x = out_conv(snake(x), stream)
    return x.squeeze(1).clamp(min=-1.0, max=1.0)


def _fuses(x: torch.Tensor) -> bool:
    """Whether the fused forms serve this activation: on CUDA with Triton, a dense [B, C, T] in either layout."""
    return compiles_for(x.device) and (x.is_contiguous() or layout.channels_dense(x))


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """`residual + (y + bias)` as a new tensor in y's layout, in one pass where there is a bias."""
    if bias is None:
        return y.clone() if residual is None else residual + y
    return fused_bias.add_bias(y, bias, residual)
