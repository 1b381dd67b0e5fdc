"""Load the codec decoder from a checkpoint's `speech_tokenizer/` directory.

Reads `config.json` and the `decoder.*` tensors of `model.safetensors` (or of the shards
listed in `model.safetensors.index.json`); the encoder half is not read. Every mismatch is
a `CodecCheckpointError` naming the file and the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from services.model.codec.config import CodecConfig
from services.model.codec.decoder import CodecDecoder
from services.model.codec.causal_conv import StreamingConv
from services.model.codec.errors import CodecCheckpointError
from services.model.kernel_choices import KernelChoices
from services.model.unset_weights import unset_weights

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DECODER_PREFIX = "decoder."
# In the checkpoint but used only when encoding audio (the RVQ's input projections).
ENCODE_ONLY_TENSORS = frozenset(
    f"{DECODER_PREFIX}quantizer.{group}.input_proj.weight" for group in ("rvq_first", "rvq_rest")
)


def load_codec_decoder(
    speech_tokenizer_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    choices: KernelChoices = KernelChoices(),
) -> CodecDecoder:
    """Build a `CodecDecoder` from `<dir>/config.json` and its safetensors, on `device` in `dtype`, its convolutions
    taking the kernels `choices` allow."""
    directory = Path(speech_tokenizer_dir)
    config = CodecConfig.from_dir(directory)
    # Built in float32 on the CPU (the codebook table is derived in float32), its weights left unset until the
    # checkpoint's are copied in: not on the meta device, whose move to the CPU (`to_empty`) imports sympy.
    with unset_weights():
        model = CodecDecoder(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    tensors = _read_decoder_tensors(directory, expected)
    model.load_state_dict(tensors, strict=True)
    model.quantizer.refresh_table()
    return place_decoder(model, device, dtype, choices)


def place_decoder(model: CodecDecoder, device: str | torch.device, dtype: torch.dtype,
                  choices: KernelChoices = KernelChoices()) -> CodecDecoder:
    """The decoder as it serves, from one whose float32 weights (and codebook table) are in place on the CPU: moved
    to `device` in `dtype`, its projections fused and its convolutions taking the kernels `choices` allow. The one
    place this wiring is written: `load_codec_decoder` and the device harness's random-weight codec both come
    through here."""
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    model.pre_transformer.fuse_projections()  # after the move: the fused weights live where the model runs
    for conv in model.modules():
        if isinstance(conv, StreamingConv):
            conv.triton_conv = choices.triton_conv
    return model


def weight_locations(directory: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from the index when sharded, else the single file."""
    index_path, single_path = directory / INDEX_FILE, directory / WEIGHTS_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CodecCheckpointError("invalid_index", f"{index_path}: cannot read weight_map: {exc}") from exc
        if not isinstance(weight_map, dict):
            raise CodecCheckpointError("invalid_index", f"{index_path}: weight_map must be a JSON object")
        return {name: directory / str(shard) for name, shard in weight_map.items()}
    if not single_path.is_file():
        raise CodecCheckpointError(
            "missing_file", f"{directory}: neither {WEIGHTS_FILE} nor {INDEX_FILE} exists"
        )
    return {name: single_path for name in _tensor_names(single_path)}


def _tensor_names(path: Path) -> list[str]:
    if not path.is_file():
        raise CodecCheckpointError("missing_file", f"{path}: weight file not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except Exception as exc:  # safetensors raises several types for a corrupt header
        raise CodecCheckpointError("unreadable_file", f"{path}: not a readable safetensors file: {exc}") from exc


def _read_decoder_tensors(directory: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Read every expected `decoder.*` tensor as float32, checking presence, dtype and shape."""
    locations = weight_locations(directory)
    _check_no_unknown_tensors(locations, expected)
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        key = DECODER_PREFIX + name
        if key not in locations:
            where = directory / (INDEX_FILE if (directory / INDEX_FILE).is_file() else WEIGHTS_FILE)
            raise CodecCheckpointError("missing_tensor", f"{where}: tensor {key!r} is missing")
        by_file.setdefault(locations[key], []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        tensors.update(_read_file(path, names, expected))
    return tensors


def _read_file(path: Path, names: list[str], expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    available = set(_tensor_names(path))
    tensors = {}
    with safe_open(str(path), framework="pt") as handle:
        for name in names:
            key = DECODER_PREFIX + name
            if key not in available:
                raise CodecCheckpointError("missing_tensor", f"{path}: tensor {key!r} is missing")
            tensor = handle.get_tensor(key)
            if not tensor.dtype.is_floating_point:
                raise CodecCheckpointError(
                    "invalid_dtype", f"{path}: tensor {key!r} has dtype {tensor.dtype}, expected a float type"
                )
            if tuple(tensor.shape) != expected[name]:
                raise CodecCheckpointError(
                    "tensor_shape_mismatch",
                    f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, "
                    f"expected {expected[name]} from config.json",
                )
            tensors[name] = tensor.float()
    return tensors


def _check_no_unknown_tensors(locations: dict[str, Path], expected: dict[str, tuple[int, ...]]) -> None:
    """A `decoder.*` tensor we do not know means the checkpoint and config disagree."""
    for key, path in locations.items():
        if not key.startswith(DECODER_PREFIX) or key in ENCODE_ONLY_TENSORS:
            continue
        if key[len(DECODER_PREFIX) :] not in expected:
            raise CodecCheckpointError(
                "unexpected_tensor", f"{path}: tensor {key!r} does not belong to the decoder described by config.json"
            )
