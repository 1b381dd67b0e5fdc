"""The base checkpoints' speaker encoder (ECAPA-TDNN): log-mel frames -> one x-vector of the talker's width.

Layout (parameter names are the checkpoint's, under `speaker_encoder.`): a first TDNN; SE-Res2Net blocks (1x1
TDNN, a Res2Net of dilated convolutions over channel groups, 1x1 TDNN, squeeze-excitation, residual); the blocks'
outputs concatenated and mixed by one more TDNN (`mfa`); attentive statistics pooling over time (`asp`); a final
1x1 convolution (`fc`). Every convolution pads "same" by reflection, as the checkpoints were trained.
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.config import SpeakerEncoderConfig
from services.model.unset_weights import unset_weights

CHECKPOINT_PREFIX = "speaker_encoder."
_STD_FLOOR = 1e-12
"""Variances are floored at this before the square root: a constant channel has std 1e-6, not 0."""


def _conv(in_channels: int, out_channels: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    if kernel == 1:  # "same" adds nothing to a 1x1 convolution, but asked for, torch still runs its pad: a copy
        return nn.Conv1d(in_channels, out_channels, 1)
    return nn.Conv1d(in_channels, out_channels, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class Tdnn(nn.Module):
    """A convolution over time followed by ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(in_channels, out_channels, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channels split into `scale` groups: the first passes through, each next one is convolved together with the
    previous group's output, so later groups see a growing receptive field."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        part = channels // scale
        self.blocks = nn.ModuleList(Tdnn(part, part, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        outputs, previous = [groups[0]], None
        for block, group in zip(self.blocks, groups[1:]):
            previous = block(group if previous is None else group + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcite(nn.Module):
    """Channel weights in (0, 1) from the time-averaged input."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * weights


class SeRes2NetBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, cfg: SpeakerEncoderConfig, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = Tdnn(in_channels, channels, 1, 1)
        self.res2net_block = Res2Net(channels, cfg.enc_res2net_scale, kernel, dilation)
        self.tdnn2 = Tdnn(channels, channels, 1, 1)
        self.se_block = SqueezeExcite(channels, cfg.enc_se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std over time of x [B, C, T] under weights summing to 1 over T."""
    mean = (weights * x).sum(dim=2)
    variance = (weights * (x - mean[..., None]) ** 2).sum(dim=2)
    return mean, torch.sqrt(variance.clamp(min=_STD_FLOOR))


class AttentiveStatsPool(nn.Module):
    """Per-channel attention over time, conditioned on the utterance's global mean and std; returns the attended
    mean and std concatenated, [B, 2C, 1]."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        uniform = torch.full_like(x[:, :1], 1.0 / frames)
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat((x, mean[..., None].expand_as(x), std[..., None].expand_as(x)), dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: mel frames [B, T, mel_dim] -> x-vectors [B, enc_dim]."""

    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        channels, kernels, dilations = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [Tdnn(cfg.mel_dim, channels[0], kernels[0], dilations[0])]
        for i in range(1, len(channels) - 1):
            blocks.append(SeRes2NetBlock(channels[i - 1], channels[i], cfg, kernels[i], dilations[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = Tdnn(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatsPool(channels[-1], cfg.enc_attention_channels)
        self.fc = _conv(channels[-1] * 2, cfg.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        # The first TDNN's output only feeds the blocks; the SE-Res2Net outputs are aggregated.
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @classmethod
    def from_checkpoint(cls, cfg: SpeakerEncoderConfig, tensors: dict[str, torch.Tensor]) -> SpeakerEncoder:
        """Build on the tensors' device and dtype from `speaker_encoder.*` checkpoint tensors (the loader's
        `TTSModel.speaker_encoder`)."""
        with torch.device("meta"), unset_weights():
            encoder = cls(cfg)
        state = {name[len(CHECKPOINT_PREFIX):]: tensor for name, tensor in tensors.items()}
        encoder.load_state_dict(state, strict=True, assign=True)
        return encoder.requires_grad_(False).eval()
