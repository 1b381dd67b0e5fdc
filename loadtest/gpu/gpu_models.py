"""The models the GPU benchmarks time, built in memory with a preset's shapes and random weights.

Writing a 0.6B checkpoint to disk and reading it back costs a device call a minute or more and changes no
timing: what the kernels see is the shapes, the dtype and non-degenerate values. So the talker and the code
predictor are built straight on the device from the preset's config.json (N(0, 0.02) matrices, unit norms,
tables shared as `load_model` shares them), and the codec decoder with the codec package's own audible
initialisation (on the CPU in float32). Both are then finished by the loaders' own functions (`loader.assemble`,
`codec.loader.place_decoder`), with the `KernelChoices` given: the projections fused, the start-up kernel checks run
and their verdicts kept, exactly as a service's model.

The scripts take the kernel switches as the services do (`add_kernel_arguments`, `kernel_choices`): the settings'
flags `--triton-conv` / `--gated-gemm` (true or false), else the settings' variables, else their defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch
from torch import nn

from services.model.code_predictor import CodePredictor
from services.model.codec import CodecConfig, CodecDecoder
from services.model.codec.loader import place_decoder
from services.model.config import load_config
from services.model.kernel_choices import KernelChoices
from services.model.layers import RMSNorm
from services.model.loader import TTSModel, assemble
from services.model.talker import Talker
from services.model.text_tokenizer import TextTokenizer
from services.random_checkpoint.codec_presets import codec_preset
from services.random_checkpoint.codec_weights import init_decoder
from services.random_checkpoint.model_presets import generation_config, num_regular_text_tokens, preset_config
from services.random_checkpoint.tokenizer_writer import build_byte_level_bpe
from services.runtime.common_settings import CommonSettings
from services.runtime.settings_schema import SettingsError, env_name, flag_name, resolve

WEIGHT_STD = 0.02
KERNEL_SETTINGS = tuple(field.name for field in dataclasses.fields(KernelChoices))
"""The services' settings that choose kernels (each a `CommonSettings` field of the same name)."""


def add_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    """The kernel settings' own flags (`--triton-conv true|false`, `--gated-gemm true|false`), worded as the services'
    settings word them."""
    fields = {field.name: field for field in dataclasses.fields(CommonSettings)}
    group = parser.add_argument_group("kernels (the services' settings)")
    for name in KERNEL_SETTINGS:
        field = fields[name]
        group.add_argument(flag_name(field), dest=name, metavar="BOOL", help=f"{field.metadata['help']} (env "
                           f"{env_name(field)}; default {field.default!r})")


def kernel_choices(args: argparse.Namespace) -> KernelChoices:
    """The kernels a service with these flags (and this environment) would take: resolved as the services resolve
    their settings (flag > VOXMESH_ variable > default)."""
    flags = argparse.Namespace(**{name: getattr(args, name, None) for name in KERNEL_SETTINGS})
    try:
        return resolve(CommonSettings, flags).kernel_choices()
    except SettingsError as error:  # a script's usage error, said as a service says it
        raise SystemExit(f"{error}") from None


def write_config_files(directory: Path, preset: str) -> Path:
    """config.json, generation_config.json and the tokenizer files of `preset` (no weights) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = preset_config(preset, "custom_voice")
    config["dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(generation_config(preset), indent=2))
    build_byte_level_bpe(directory, num_regular_text_tokens(config))
    return directory


@torch.no_grad()
def _randomise(module: nn.Module, generator: torch.Generator) -> None:
    """N(0, WEIGHT_STD) matrices and tables, zero biases, unit norm weights (no zeros: they hide bugs and run fast)."""
    for sub in module.modules():
        if isinstance(sub, RMSNorm):
            sub.weight.fill_(1.0)
        elif isinstance(sub, (nn.Linear, nn.Embedding)):
            sub.weight.normal_(0.0, WEIGHT_STD, generator=generator)
            bias = getattr(sub, "bias", None)
            if bias is not None:
                bias.zero_()


def build_model(directory: Path, device: torch.device, dtype: torch.dtype, seed: int = 0,
                choices: KernelChoices = KernelChoices()) -> TTSModel:
    """A `TTSModel` of the config in `directory` with random weights on `device` in `dtype`, finished as
    `load_model` finishes one (`loader.assemble`: the kernels `choices` allow, the start-up checks' verdicts).

    The code predictor's E0 and codebook tables are the talker's tensors, as `load_model` shares them.
    """
    config, generation = load_config(directory)
    with torch.device("meta"):
        talker, predictor = Talker(config.talker), CodePredictor(config.talker)
    talker = talker.to_empty(device=device).to(dtype)
    predictor = predictor.to_empty(device=device).to(dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    _randomise(talker, generator)
    _randomise(predictor, generator)
    predictor.first_embedding.weight = talker.codec_embedding.weight
    for mine, shared in zip(predictor.codec_embedding, talker.codebook_embedding):
        mine.weight = shared.weight
    return assemble(directory, config, generation, talker, predictor, None, choices)


def build_tokenizer(directory: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(directory)


def build_in_memory(preset: str, device: torch.device, dtype: torch.dtype,
                    choices: KernelChoices = KernelChoices()) -> tuple[TTSModel, TextTokenizer]:
    """`preset`'s model (random weights) and its tokenizer, from config files written to a directory removed
    after: what a probe needs without a checkpoint on disk."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_config_files(Path(scratch) / preset, preset)
        return build_model(directory, device, dtype, choices=choices), build_tokenizer(directory)


def build_codec(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0,
                choices: KernelChoices = KernelChoices()) -> CodecDecoder:
    """The codec decoder of `preset` with the codec package's audible random weights, on `device` in `dtype`,
    finished as `load_codec_decoder` finishes one (`place_decoder`: the kernels `choices` allow)."""
    config = CodecConfig.from_dict(codec_preset(preset), source=f"codec preset {preset!r}")
    decoder = CodecDecoder(config).eval()
    init_decoder(decoder, seed)
    return place_decoder(decoder, device, dtype, choices)


def kernels_record(choices: KernelChoices, model: TTSModel | None = None) -> dict[str, dict[str, bool]]:
    """What a report keeps of the kernels it measured: the choices, and the start-up checks' verdicts of `model`."""
    record = {"choices": dataclasses.asdict(choices)}
    if model is not None:
        record["verdicts"] = dataclasses.asdict(model.kernels)
    return record
