"""Sample-rate conversion by Kaiser-windowed sinc interpolation, computed polyphase.

The rates' ratio is reduced to `up / down` (44100 -> 24000 is 80 / 147). Output sample `q * up + r` sits at input
position `q * down + r * down / up`; each of the `up` phases has its own short filter, and one strided convolution
over the input computes every phase at once. The low-pass cutoff sits just under the lower of the two Nyquist
frequencies, so downsampling does not alias and upsampling adds no images.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from services.model.voice.errors import ReferenceAudioError

ZERO_CROSSINGS = 32
"""Sinc lobes kept on each side of a tap: sharper transition (and more taps) the more there are."""
ROLLOFF = 0.95
"""Cutoff as a fraction of the lower Nyquist frequency: the transition band ends before Nyquist."""
KAISER_BETA = 12.0
"""Window shape: about 120 dB of stopband attenuation."""
MAX_KERNEL_VALUES = 8_000_000
"""Rates whose reduced ratio needs a larger phase table (e.g. 24001 Hz) are refused instead of allocating it."""


def resample(samples: torch.Tensor, from_rate: int, to_rate: int) -> torch.Tensor:
    """1-D float samples at `from_rate` Hz -> at `to_rate` Hz, `ceil(n * to_rate / from_rate)` of them."""
    if from_rate == to_rate:
        return samples
    common = math.gcd(from_rate, to_rate)
    down, up = from_rate // common, to_rate // common
    kernel, reach = phase_filters(down, up)
    num_out = -(-samples.shape[0] * up // down)
    num_blocks = -(-num_out // up)
    taps = kernel.shape[-1]
    right = max(0, (num_blocks - 1) * down + taps - reach - samples.shape[0])
    padded = F.pad(samples[None, None], (reach, right))
    phases = F.conv1d(padded, kernel.to(device=samples.device, dtype=samples.dtype), stride=down)[0]
    return phases.T.reshape(-1)[:num_out]


def phase_filters(down: int, up: int) -> tuple[torch.Tensor, int]:
    """The `up` phase filters [up, 1, taps] and how many input samples each reaches before its first output.

    Tap j of phase r weighs input sample `q * down - reach + j` for output `q * up + r`: at distance
    `d = r * down / up + reach - j` input samples, its weight is `fc * sinc(fc * d)` under a Kaiser window, with
    `fc` the cutoff relative to the input's Nyquist frequency (the weights of a phase sum to about 1).
    """
    cutoff = ROLLOFF * min(1.0, up / down)
    half_width = ZERO_CROSSINGS / cutoff
    reach = math.ceil(half_width)
    taps = 2 * reach + down
    if up * taps > MAX_KERNEL_VALUES:
        raise ReferenceAudioError("unsupported_sample_rate", f"cannot resample between rates whose ratio reduces to "
                                  f"{up}/{down}; use a common rate such as 16000, 22050, 44100 or 48000 Hz")
    offsets = torch.arange(up, dtype=torch.float64)[:, None] * down / up
    distance = offsets + reach - torch.arange(taps, dtype=torch.float64)[None, :]
    ratio = (distance / half_width).clamp(-1.0, 1.0)
    window = torch.special.i0(KAISER_BETA * torch.sqrt(1.0 - ratio**2)) / torch.special.i0(torch.tensor(KAISER_BETA,
                                                                                                   dtype=torch.float64))
    window = torch.where(distance.abs() < half_width, window, torch.zeros_like(window))
    weights = cutoff * torch.sinc(cutoff * distance) * window
    return weights.to(torch.float32)[:, None, :], reach
