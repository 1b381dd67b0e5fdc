"""Deterministic random weights for a codec checkpoint that decodes to audible, non-silent audio.

Default (or zero) initialisation decodes to near-silence, and the reference's codebooks start
at zero. Here every tensor is drawn from a generator keyed by (seed, tensor name), so a
tensor's values do not depend on the order of writing. Convolutions preserve variance, the
residual branches are damped (30-odd SnakeBeta layers otherwise amplify float rounding into
chaos), and the output conv is calibrated on random codes to a fixed loudness without DC.
"""

from __future__ import annotations

import math
import zlib
import torch
from torch import nn

from services.model.codec.config import CodecConfig
from services.model.codec.decoder import CodecDecoder
from services.model.codec.loader import DECODER_PREFIX, ENCODE_ONLY_TENSORS
from services.model.codec.vocoder import ResidualUnit

CODEBOOK_STD = 0.5
SNAKE_STD = 0.3
SCALE_STD = 0.3
"""Layer scales and ConvNeXt gammas: large enough that the transformer and ConvNeXt matter."""
RESIDUAL_GAIN = 0.1
TARGET_RMS = 0.2
"""Loudness of the calibrated output (full scale is 1.0)."""
_CALIBRATION_FRAMES = 8


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _normal(shape: tuple[int, ...], std: float, seed: int, name: str) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, name)) * std


def _weight_std(module: nn.Module, name: str, residual_branch: set[str]) -> float:
    weight = module.weight
    if isinstance(module, nn.ConvTranspose1d):
        # Each output sample sums in_channels * kernel / stride inputs.
        fan_in = weight.shape[0] * weight.shape[2] / module.stride[0]
    else:
        fan_in = math.prod(weight.shape[1:])
    gain = RESIDUAL_GAIN if name in residual_branch else 1.0
    return gain / math.sqrt(fan_in)


@torch.no_grad()
def init_decoder(model: CodecDecoder, seed: int) -> None:
    """Fill every decoder tensor deterministically, then calibrate the output level."""
    residual_branch = {
        f"{unit_name}.conv2.conv" for unit_name, unit in model.named_modules() if isinstance(unit, ResidualUnit)
    }
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
            std = _weight_std(module, module_name, residual_branch)
            module.weight.copy_(_normal(tuple(module.weight.shape), std, seed, module_name + ".weight"))
            if module.bias is not None:
                module.bias.copy_(_normal(tuple(module.bias.shape), 0.02, seed, module_name + ".bias"))
    for name, tensor in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            tensor.copy_(_normal(tuple(tensor.shape), CODEBOOK_STD, seed, name))
        elif leaf == "cluster_usage":
            tensor.fill_(1.0)
        elif leaf in ("alpha", "beta"):
            tensor.copy_(_normal(tuple(tensor.shape), SNAKE_STD, seed, name))
        elif leaf in ("scale", "gamma"):
            tensor.copy_(_normal(tuple(tensor.shape), SCALE_STD, seed, name))
        elif "norm" in name:
            tensor.fill_(1.0 if leaf == "weight" else 0.0)
    model.quantizer.refresh_table()
    _calibrate_output(model, seed)


@torch.no_grad()
def _calibrate_output(model: CodecDecoder, seed: int) -> None:
    """Rescale the output conv so random codes decode at TARGET_RMS around zero.

    SnakeBeta adds sin^2 >= 0 at every layer, which piles up into a DC offset that a trained
    model's biases cancel; a random one needs it cancelled explicitly.
    """
    output_conv = model.decoder[-1].conv
    captured: list[torch.Tensor] = []
    hook = output_conv.register_forward_hook(lambda _m, _i, out: captured.append(out - output_conv.bias[:, None]))
    try:
        generator = _generator(seed, "calibration")
        codes = torch.randint(0, model.config.codebook_size, (_CALIBRATION_FRAMES, model.config.num_quantizers),
                              generator=generator)
        model.decode(codes)
    finally:
        hook.remove()
    raw = captured[0].double()
    factor = TARGET_RMS / max(float(raw.std()), 1e-12)
    output_conv.weight.mul_(factor)
    output_conv.bias.fill_(-float(raw.mean()) * factor)


def decoder_tensors(config: CodecConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every `decoder.*` tensor of the checkpoint, float32, including the encode-only RVQ input
    projections (which decoding ignores but the released layout holds)."""
    model = CodecDecoder(config).eval()
    init_decoder(model, seed)
    tensors = {DECODER_PREFIX + name: t.detach().clone() for name, t in model.state_dict().items()}
    for name in sorted(ENCODE_ONLY_TENSORS):
        tensors[name] = _normal(encode_only_shape(config), 1.0 / math.sqrt(config.codebook_dim), seed, name)
    return tensors


def encode_only_shape(config: CodecConfig) -> tuple[int, int, int]:
    """Shape of each RVQ input projection (codebook_dim -> codebook_dim / 2, a 1x1 conv)."""
    return (config.codebook_entry_dim, config.codebook_dim, 1)


def encoder_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """One deterministic `encoder.*` tensor: plain variance-preserving weights, unit usage counts and
    N(0, 0.5) codebooks, which encode random audio to varied codes (voice cloning's tests need that)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("initialized", "cluster_usage") or (leaf == "weight" and "norm" in name):
        return torch.ones(shape)
    if leaf == "embed_sum":
        return _normal(shape, CODEBOOK_STD, seed, name)
    if leaf == "scale":
        return torch.full(shape, 0.01)
    if len(shape) == 1:
        return torch.zeros(shape)
    return _normal(shape, 1.0 / math.sqrt(math.prod(shape[1:])), seed, name)

