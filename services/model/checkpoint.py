"""Reading the weights of a checkpoint: one `model.safetensors`, or shards listed by `model.safetensors.index.json`.

Names and shapes are checked against what the config implies before any tensor is loaded; a missing,
unexpected or mis-shaped tensor, an unreadable file or an inconsistent index fails with a `CheckpointError`
naming the file and the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from services.model.config import SpeakerEncoderConfig, read_json
from services.model.errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}


@dataclass(frozen=True, slots=True)
class StoredTensor:
    file: Path
    shape: tuple[int, ...]
    dtype: str


def _weight_map(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file the index says holds it (empty when the checkpoint is one file)."""
    index = directory / INDEX_FILE
    if not index.is_file():
        if not (directory / WEIGHTS_FILE).is_file():
            raise CheckpointError(directory, f"no {WEIGHTS_FILE} and no {INDEX_FILE}: this is not a checkpoint directory")
        return {}
    data = read_json(index)
    mapping = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise CheckpointError(index, "needs a 'weight_map' object of tensor name -> file name")
    for name, file in mapping.items():
        if Path(file).name != file or not (directory / file).is_file():
            raise CheckpointError(index, f"names shard {file!r}, which is not a file in {directory}", tensor=name)
    return {name: directory / file for name, file in mapping.items()}


def _read_header(file: Path) -> dict[str, StoredTensor]:
    try:
        with safe_open(file, framework="pt") as handle:
            return {
                name: StoredTensor(file, tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                for name in handle.keys()
            }
    except Exception as exc:  # safetensors raises its own error types, and OSError for unreadable files
        raise CheckpointError(file, f"not a readable safetensors file: {exc}") from exc


def scan(directory: Path) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint with its file, shape and dtype, read from the headers only."""
    mapping = _weight_map(directory)
    files = sorted(set(mapping.values())) or [directory / WEIGHTS_FILE]
    stored: dict[str, StoredTensor] = {}
    for file in files:
        for name, tensor in _read_header(file).items():
            if name in stored:
                raise CheckpointError(file, f"also stored in {stored[name].file.name}", tensor=name)
            stored[name] = tensor
    for name, file in mapping.items():
        if name not in stored or stored[name].file != file:
            raise CheckpointError(file, f"{INDEX_FILE} places this tensor here, but the file does not hold it", tensor=name)
    return stored


def check(stored: Mapping[str, StoredTensor], expected: Mapping[str, tuple[int, ...]], directory: Path) -> None:
    """Fail on the first missing, unexpected, mis-shaped or non-float tensor."""
    default_file = directory / (INDEX_FILE if (directory / INDEX_FILE).is_file() else WEIGHTS_FILE)
    for name, shape in expected.items():
        tensor = stored.get(name)
        if tensor is None:
            missing = [n for n in expected if n not in stored]
            more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
            raise CheckpointError(default_file, f"missing; the config needs it with shape {list(shape)}{more}", tensor=name)
        if tensor.shape != tuple(shape):
            raise CheckpointError(tensor.file, f"shape {list(tensor.shape)} does not match the config's {list(shape)}", tensor=name)
        if tensor.dtype not in _FLOAT_DTYPES:
            raise CheckpointError(tensor.file, f"dtype {tensor.dtype} is not a floating-point type", tensor=name)
    for name, tensor in stored.items():
        if name not in expected:
            raise CheckpointError(tensor.file, "unexpected: the config describes no such tensor", tensor=name)


def load_tensors(
    stored: Mapping[str, StoredTensor], names: list[str], dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Load `names`, converted to dtype and moved to device, one file open at a time."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(stored[name].file, []).append(name)
    tensors = {}
    for file, file_names in by_file.items():
        try:
            with safe_open(file, framework="pt") as handle:
                for name in file_names:
                    tensors[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
        except Exception as exc:
            raise CheckpointError(file, f"could not read tensor data: {exc}") from exc
    return tensors


def speaker_encoder_shapes(cfg: SpeakerEncoderConfig, prefix: str = "speaker_encoder.") -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the ECAPA-TDNN speaker encoder of base checkpoints."""
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name: str, out_ch: int, in_ch: int, kernel: int) -> None:
        shapes[f"{prefix}{name}.weight"] = (out_ch, in_ch, kernel)
        shapes[f"{prefix}{name}.bias"] = (out_ch,)

    channels, kernels = cfg.enc_channels, cfg.enc_kernel_sizes
    conv("blocks.0.conv", channels[0], cfg.mel_dim, kernels[0])
    for i in range(1, len(channels) - 1):
        width, part = channels[i], channels[i] // cfg.enc_res2net_scale
        conv(f"blocks.{i}.tdnn1.conv", width, channels[i - 1], 1)
        for j in range(cfg.enc_res2net_scale - 1):
            conv(f"blocks.{i}.res2net_block.blocks.{j}.conv", part, part, kernels[i])
        conv(f"blocks.{i}.tdnn2.conv", width, width, 1)
        conv(f"blocks.{i}.se_block.conv1", cfg.enc_se_channels, width, 1)
        conv(f"blocks.{i}.se_block.conv2", width, cfg.enc_se_channels, 1)
    last = channels[-1]
    conv("mfa.conv", last, last, kernels[-1])
    conv("asp.tdnn.conv", cfg.enc_attention_channels, last * 3, 1)
    conv("asp.conv", last, cfg.enc_attention_channels, 1)
    conv("fc", cfg.enc_dim, last * 2, 1)
    return shapes
