"""What a checkpoint directory holds, read from its JSON files and safetensors headers (no weights loaded).

`summarize(dir)` backs `voxmesh model info`. `checkpoint_fingerprint(dir)` is a short, stable hash of
the config, the tensor names/dtypes/shapes, and a fixed sample of the weight bytes: checkpoints that
differ only in their random seed get different fingerprints, and computing it reads about a megabyte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SAMPLES_PER_FILE = 16
_SAMPLE_BYTES = 64 * 1024


class CheckpointInfoError(ValueError):
    """The directory is not a readable checkpoint; `code` is machine-readable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    directory: Path
    config: dict[str, Any]
    generation: dict[str, Any] | None
    weight_files: tuple[Path, ...]
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    """Tensor name -> (safetensors dtype, shape), over every weight file."""
    has_codec: bool
    fingerprint: str

    @property
    def num_parameters(self) -> int:
        total = 0
        for _, shape in self.tensors.values():
            count = 1
            for dim in shape:
                count *= dim
            total += count
        return total

    @property
    def weights_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.weight_files)


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointInfoError(f"{path}: file is missing", "file_missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointInfoError(f"{path}: not valid JSON: {exc}", "invalid_json") from exc
    if not isinstance(data, dict):
        raise CheckpointInfoError(f"{path}: expected a JSON object", "invalid_json")
    return data


def weight_files(directory: Path) -> tuple[Path, ...]:
    """model.safetensors, or the shards named by model.safetensors.index.json."""
    single = directory / "model.safetensors"
    if single.is_file():
        return (single,)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map", {})
        return tuple(directory / name for name in sorted(set(weight_map.values())))
    raise CheckpointInfoError(f"{directory}: no model.safetensors or model.safetensors.index.json", "weights_missing")


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data_offsets)."""
    try:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if size <= 0 or size > 100 * 1024**2:
                raise CheckpointInfoError(f"{path}: not a safetensors file (header size {size})", "invalid_weights")
            header = json.loads(handle.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointInfoError(f"{path}: unreadable safetensors header: {exc}", "invalid_weights") from exc
    header.pop("__metadata__", None)
    return header


def checkpoint_fingerprint(directory: str | Path) -> str:
    """16 hex digits over config.json, the tensor metadata, and sampled weight bytes."""
    directory = Path(directory)
    digest = hashlib.sha256()
    digest.update(json.dumps(read_json(directory / "config.json"), sort_keys=True).encode())
    for path in weight_files(directory):
        header = safetensors_header(path)
        meta = {name: (entry["dtype"], entry["shape"]) for name, entry in header.items()}
        digest.update(json.dumps(meta, sort_keys=True).encode())
        size = path.stat().st_size
        with open(path, "rb") as handle:
            for k in range(_SAMPLES_PER_FILE):
                handle.seek(max(0, (size - _SAMPLE_BYTES) * k // max(_SAMPLES_PER_FILE - 1, 1)))
                digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def summarize(directory: str | Path) -> CheckpointSummary:
    """Read a checkpoint directory's metadata; raises `CheckpointInfoError` naming the file at fault."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointInfoError(f"{directory}: not a directory", "not_a_directory")
    config = read_json(directory / "config.json")
    generation_path = directory / "generation_config.json"
    generation = read_json(generation_path) if generation_path.is_file() else None
    files = weight_files(directory)
    tensors = {}
    for path in files:
        for name, entry in safetensors_header(path).items():
            tensors[name] = (entry["dtype"], tuple(entry["shape"]))
    has_codec = (directory / "speech_tokenizer" / "config.json").is_file()
    return CheckpointSummary(directory, config, generation, files, tensors, has_codec, checkpoint_fingerprint(directory))


def _decoder_line(cfg: dict[str, Any]) -> str:
    return (
        f"hidden {cfg.get('hidden_size')}, layers {cfg.get('num_hidden_layers')}, "
        f"heads {cfg.get('num_attention_heads')}:{cfg.get('num_key_value_heads')} x {cfg.get('head_dim')}, "
        f"ffn {cfg.get('intermediate_size')}"
    )


def describe(summary: CheckpointSummary) -> list[str]:
    """Human-readable lines for `voxmesh model info`."""
    config, talker = summary.config, summary.config.get("talker_config", {})
    predictor = talker.get("code_predictor_config", {})
    dialects = talker.get("spk_is_dialect", {}) or {}
    speakers = [f"{name} ({dialects[name]})" if dialects.get(name) else name for name in sorted(talker.get("spk_id", {}))]
    languages = ["auto"] + sorted(n for n in talker.get("codec_language_id", {}) if "dialect" not in n)
    dtypes = sorted({dtype for dtype, _ in summary.tensors.values()})
    return [
        f"checkpoint      {summary.directory}",
        f"type            {config.get('tts_model_type')} (size {config.get('tts_model_size')}, weights {', '.join(dtypes)})",
        f"talker          {_decoder_line(talker)}, codec vocab {talker.get('vocab_size')}",
        f"code predictor  {_decoder_line(predictor)}, {predictor.get('num_code_groups', 16) - 1} codebooks x "
        f"{predictor.get('vocab_size')}",
        f"text            vocab {talker.get('text_vocab_size')} x {talker.get('text_hidden_size')}, "
        f"im_start {config.get('im_start_token_id')}, tts_pad {config.get('tts_pad_token_id')}",
        f"speakers        {', '.join(speakers) or '(none)'}",
        f"languages       {', '.join(languages)}",
        f"weights         {len(summary.tensors)} tensors, {summary.num_parameters / 1e6:.1f}M parameters, "
        f"{summary.weights_bytes / 1e6:.1f} MB in {len(summary.weight_files)} file(s)",
        f"codec           {'speech_tokenizer/ present' if summary.has_codec else 'speech_tokenizer/ MISSING'}",
        f"fingerprint     {summary.fingerprint}",
    ]
