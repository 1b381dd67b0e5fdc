"""Write a complete `speech_tokenizer/` directory with deterministic random weights.

The layout is the released one: `config.json`, `preprocessor_config.json` (the reference
loads a feature extractor from it) and `model.safetensors` holding both halves of the
speech tokenizer, the Mimi-style encoder and the decoder, with the reference's tensor names
and shapes. The same (preset, seed, dtype) always gives the same bytes.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from services.model.codec.config import CONFIG_FILE, CodecConfig
from services.model.codec.decoder import CodecDecoder
from services.model.codec.errors import CodecConfigError
from services.model.codec.loader import DECODER_PREFIX, ENCODE_ONLY_TENSORS, WEIGHTS_FILE
from services.random_checkpoint.codec_encoder_layout import encoder_tensor_shapes
from services.random_checkpoint.codec_presets import PREPROCESSOR_CONFIG, codec_preset
from services.random_checkpoint.codec_weights import decoder_tensors, encode_only_shape, encoder_tensor

SPEECH_TOKENIZER_DIR = "speech_tokenizer"
PREPROCESSOR_FILE = "preprocessor_config.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_PROGRESS_THRESHOLD_BYTES = 64 * 2**20
"""With `progress=None`, report progress only for checkpoints at least this large."""


def write_codec_checkpoint(
    out_dir: str | Path,
    preset: str,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
    progress: bool | None = None,
) -> Path:
    """Write `<out_dir>/speech_tokenizer/` for preset tiny, 0.6b or 1.7b; return its path.

    `progress` prints steps to stderr: True always, False never, None for large checkpoints.
    """
    torch_dtype = _resolve_dtype(dtype)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CodecConfigError("invalid_seed", f"seed must be a non-negative integer, got {seed!r}")
    config_dict = codec_preset(preset)
    config_dict["dtype"] = str(torch_dtype).removeprefix("torch.")
    config = CodecConfig.from_dict(config_dict, source=f"codec preset {preset!r}")
    encoder_shapes = encoder_tensor_shapes(config_dict["encoder_config"])
    report = _reporter(progress, config, encoder_shapes, torch_dtype)

    target = Path(out_dir) / SPEECH_TOKENIZER_DIR
    target.mkdir(parents=True, exist_ok=True)
    report(f"speech_tokenizer ({preset}): generating decoder weights")
    tensors = {name: t.to(torch_dtype) for name, t in decoder_tensors(config, seed).items()}
    report(f"speech_tokenizer ({preset}): generating encoder weights")
    _add_encoder_tensors(tensors, encoder_shapes, seed, torch_dtype)
    total_mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    report(f"speech_tokenizer ({preset}): writing {WEIGHTS_FILE} ({len(tensors)} tensors, {total_mb:.0f} MiB)")
    _write_atomically(target / WEIGHTS_FILE, lambda path: save_file(tensors, str(path), metadata={"format": "pt"}))
    _write_json(target / CONFIG_FILE, config_dict)
    _write_json(target / PREPROCESSOR_FILE, PREPROCESSOR_CONFIG)
    report(f"speech_tokenizer ({preset}): done -> {target}")
    return target


def codec_checkpoint_shapes(preset: str) -> dict[str, tuple[int, ...]]:
    """Every tensor name -> shape that `write_codec_checkpoint` writes for `preset`, computed
    without generating any weights (the released presets hold ~170M values)."""
    config_dict = codec_preset(preset)
    config = CodecConfig.from_dict(config_dict, source=f"codec preset {preset!r}")
    with torch.device("meta"):
        decoder = CodecDecoder(config)
    shapes = {DECODER_PREFIX + name: tuple(t.shape) for name, t in decoder.state_dict().items()}
    shapes.update({name: encode_only_shape(config) for name in ENCODE_ONLY_TENSORS})
    shapes.update(encoder_tensor_shapes(config_dict["encoder_config"]))
    return shapes


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise CodecConfigError("unsupported_dtype", f"checkpoint dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")


def _add_encoder_tensors(tensors, shapes, seed: int, dtype: torch.dtype) -> None:
    for name in sorted(shapes):
        tensors[name] = encoder_tensor(name, shapes[name], seed).to(dtype)


def _reporter(progress: bool | None, config: CodecConfig, encoder_shapes, dtype: torch.dtype) -> Callable[[str], None]:
    if progress is None:
        with torch.device("meta"):
            num_decoder = sum(t.numel() for t in CodecDecoder(config).state_dict().values())
        num_encoder = sum(math.prod(shape) for shape in encoder_shapes.values())
        bytes_per_value = torch.finfo(dtype).bits // 8
        progress = (num_decoder + num_encoder) * bytes_per_value >= _PROGRESS_THRESHOLD_BYTES
    if not progress:
        return lambda _message: None
    return lambda message: print(message, file=sys.stderr, flush=True)


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary name so an interrupted run never leaves a truncated file."""
    partial = path.with_name(path.name + ".partial")
    write(partial)
    os.replace(partial, path)


def _write_json(path: Path, data: dict) -> None:
    _write_atomically(path, lambda p: p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8"))
