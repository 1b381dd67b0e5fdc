"""The log-mel spectrogram the speaker encoder reads: 24 kHz audio, 1024-point STFT every 256 samples, 128 mel bands
of Slaney's scale and area normalisation up to 12 kHz, natural log of the magnitude (floored at 1e-5).

Frames are not centred: the signal is reflect-padded by (n_fft - hop) / 2 on both sides, so n samples give
n // hop frames (for n > 384).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(frozen=True, slots=True)
class MelSettings:
    sample_rate: int = 24000
    n_fft: int = 1024
    hop: int = 256
    n_mels: int = 128
    fmin: float = 0.0
    fmax: float = 12000.0
    floor: float = 1e-5
    """Magnitudes below it are raised to it before the log (silence maps to log(1e-5), not -inf)."""


_LINEAR_HZ_PER_MEL = 200.0 / 3
_LOG_START_HZ = 1000.0
_LOG_STEP = math.log(6.4) / 27.0


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    linear = hz / _LINEAR_HZ_PER_MEL
    log_start = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
    logarithmic = log_start + torch.log(hz.clamp(min=_LOG_START_HZ) / _LOG_START_HZ) / _LOG_STEP
    return torch.where(hz >= _LOG_START_HZ, logarithmic, linear)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    log_start = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_START_HZ * torch.exp(_LOG_STEP * (mel - log_start))
    return torch.where(mel >= log_start, logarithmic, mel * _LINEAR_HZ_PER_MEL)


def mel_filterbank(settings: MelSettings) -> torch.Tensor:
    """Triangular filters [n_mels, n_fft // 2 + 1] over the STFT bins, each scaled to unit area (Slaney)."""
    bins = torch.linspace(0.0, settings.sample_rate / 2, settings.n_fft // 2 + 1, dtype=torch.float64)
    edges_mel = torch.linspace(float(hz_to_mel(torch.tensor(settings.fmin, dtype=torch.float64))),
                               float(hz_to_mel(torch.tensor(settings.fmax, dtype=torch.float64))),
                               settings.n_mels + 2, dtype=torch.float64)
    edges = mel_to_hz(edges_mel)
    widths = edges[1:] - edges[:-1]
    to_bin = edges[:, None] - bins[None, :]
    rising = -to_bin[:-2] / widths[:-1, None]
    falling = to_bin[2:] / widths[1:, None]
    triangles = torch.clamp(torch.minimum(rising, falling), min=0.0)
    area = 2.0 / (edges[2:] - edges[:-2])
    return (triangles * area[:, None]).to(torch.float32)


class LogMel:
    """Computes the log-mel frames [frames, n_mels] of 1-D samples; holds the filterbank and window."""

    def __init__(self, settings: MelSettings, device: torch.device | str = "cpu") -> None:
        self.settings = settings
        self.filters = mel_filterbank(settings).to(device)
        self.window = torch.hann_window(settings.n_fft, device=device)

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        s = self.settings
        pad = (s.n_fft - s.hop) // 2
        padded = F.pad(samples.float()[None, None], (pad, pad), mode="reflect")[0]
        spectrum = torch.stft(padded, s.n_fft, hop_length=s.hop, win_length=s.n_fft, window=self.window,
                              center=False, normalized=False, onesided=True, return_complex=True)[0]
        # The small constant keeps the square root's gradient finite at zero; it is part of the reference's math.
        magnitude = torch.sqrt(spectrum.real**2 + spectrum.imag**2 + 1e-9)
        return torch.log(torch.clamp(self.filters @ magnitude, min=s.floor)).T
