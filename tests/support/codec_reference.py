"""Tiny random codec decoders built with the reference package's own classes, saved to disk.

The parity tests load these into voxmesh and compare against the reference's forward pass.
Weights are re-initialised so that every part of the decoder matters to the output (the
default init leaves codebooks at zero and near-silent audio; see MODEL.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from tests.support.oracle.reference import load as load_reference

TINY_ENCODER = {
    "hidden_size": 16, "num_filters": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32, "codebook_size": 64,
    "codebook_dim": 8, "vector_quantization_hidden_dimension": 8, "num_quantizers": 16,
    "upsample_groups": 16, "_frame_rate": 12.5,
}

# Window 4 and 3 layers: the attention alone reaches 3 * 3 = 9 frames back, so sequences of
# 20+ frames and chunks of 1, 2, 3, 7 frames expose any lost left context.
WINDOWED_DECODER = {
    "codebook_size": 64, "codebook_dim": 16, "latent_dim": 16, "hidden_size": 16,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32,
    "num_hidden_layers": 3, "sliding_window": 4, "decoder_dim": 32, "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
}


def reference_classes():
    """(config class, model class) of the reference 12 Hz speech tokenizer."""
    load_reference()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    return Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model


CONV_GAIN = 1.2
"""Scales PyTorch's default U(+-1/sqrt(fan_in)) conv/linear weights. Much lower and the signal
dies in the vocoder (audio barely depends on the codes); much higher and the 30-odd SnakeBeta
layers amplify float rounding until two correct implementations disagree. At 1.2 with
SNAKE_STD 0.3, two implementations agree to ~1e-7 and the audio follows every code."""
BIAS_GAIN = 0.1
SNAKE_STD = 0.3


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every-part-matters init: convs/linears scaled defaults, codebooks N(0, 0.5), SnakeBeta
    N(0, SNAKE_STD), layer scales and ConvNeXt gammas N(0, 0.3), norms near 1."""
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
            module.reset_parameters()
            module.weight.mul_(CONV_GAIN)
            if module.bias is not None:
                module.bias.mul_(BIAS_GAIN)
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        normal = torch.randn(tensor.shape, generator=generator)
        if leaf in ("embedding_sum", "embed_sum"):
            tensor.copy_(normal * 0.5)
        elif leaf in ("alpha", "beta"):
            tensor.copy_(normal * SNAKE_STD)
        elif leaf == "cluster_usage":
            tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
        elif leaf in ("scale", "gamma"):
            tensor.copy_(normal * 0.3)
        elif "norm" in name and leaf in ("weight", "bias"):
            tensor.copy_((1.0 if leaf == "weight" else 0.0) + 0.1 * normal)


def build_reference_tokenizer(out_dir: Path, decoder: dict, seed: int = 0):
    """Build, randomise and save a reference speech tokenizer; return the reference model."""
    config_class, model_class = reference_classes()
    config = config_class(encoder_config=dict(TINY_ENCODER), decoder_config=dict(decoder))
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomize(model, seed)
    model.save_pretrained(str(out_dir))
    return model


FIXTURE_CACHE_ENV = "VOXMESH_REFERENCE_FIXTURES"
"""A folder of checkpoints built by `save_reference_tokenizer` on a machine that has the reference package, for one
that does not (the GPU machine lacks `qwen-tts` and its librosa/numba/scipy stack): set, a checkpoint found there is
copied instead of built, and one built is also saved there."""


def save_reference_tokenizer(out_dir: Path, decoder: dict, seed: int = 0) -> None:
    """`build_reference_tokenizer`'s files in out_dir, without the model object: from the fixture cache when it has
    them (same encoder, decoder and seed), else built with the reference package."""
    cache = os.environ.get(FIXTURE_CACHE_ENV)
    key = json.dumps([TINY_ENCODER, decoder, seed, CONV_GAIN, BIAS_GAIN, SNAKE_STD], sort_keys=True)
    cached = Path(cache) / hashlib.sha256(key.encode()).hexdigest()[:16] if cache else None
    if cached is not None and cached.is_dir():
        shutil.copytree(cached, out_dir, dirs_exist_ok=True)
        return
    build_reference_tokenizer(out_dir, decoder, seed)
    if cached is not None:
        staging = cached.with_name(cached.name + ".partial")  # never a half-written entry under the real name
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(out_dir, staging)
        staging.rename(cached)


def reference_decode(model, codes: torch.Tensor) -> torch.Tensor:
    """The reference decoder's waveform for codes [T, Q] (one forward pass for T <= 300)."""
    with torch.no_grad():
        wav = model.decoder(codes.T[None].long())
    return wav[0, 0]


def random_codes(num_frames: int, num_quantizers: int, codebook_size: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, codebook_size, (num_frames, num_quantizers), generator=generator)
