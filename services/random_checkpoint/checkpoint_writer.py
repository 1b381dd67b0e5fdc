"""`voxmesh model init`: write a complete Qwen3-TTS checkpoint with deterministic random weights.

The layout is the released one: config.json, generation_config.json, model.safetensors (released
tensor names and shapes, see `tensor_plan`), the tokenizer files (`tokenizer_writer`), and
speech_tokenizer/ (`codec_writer`). Every tensor draws from its own generator keyed by (seed, tensor name, chunk),
so a tensor's values do not depend on which other tensors exist or in what order they are written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from services.random_checkpoint.codec_writer import write_codec_checkpoint
from services.random_checkpoint.model_presets import generation_config, num_regular_text_tokens, preset_config
from services.random_checkpoint.safetensors_writer import ProgressLine, write_safetensors
from services.random_checkpoint.tensor_plan import TensorPlan, plan_tensors
from services.random_checkpoint.tokenizer_writer import build_byte_level_bpe

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WEIGHTS_FILE = "model.safetensors"
_CHUNK_ELEMENTS = 1 << 23  # rows per chunk are chosen so a chunk stays near this many values
_PROGRESS_MIN_BYTES = 256 * 1024**2  # smaller writes finish too fast to need a progress line


class CheckpointInitError(ValueError):
    """`model init` cannot write the checkpoint as asked; `code` is machine-readable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def write_checkpoint(
    out_dir: str | Path,
    preset: str,
    seed: int,
    dtype: str = "float32",
    tts_model_type: str = "custom_voice",
    *,
    overwrite: bool = False,
    with_codec: bool = True,
    show_progress: bool | None = None,
) -> Path:
    """Write a checkpoint of `preset` into `out_dir` and return its path.

    `overwrite` allows a non-empty `out_dir`; `with_codec=False` skips speech_tokenizer/ (for
    tests of the talker files alone); `show_progress` None means "on for writes over 256 MB".
    """
    config = preset_config(preset, tts_model_type)
    torch_dtype = _torch_dtype(dtype)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CheckpointInitError(f"seed must be a non-negative integer, got {seed!r}", "invalid_seed")
    out = _prepare_dir(Path(out_dir), overwrite)
    config["dtype"] = dtype
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config(preset))
    build_byte_level_bpe(out, num_regular_text_tokens(config))
    write_weights(out / WEIGHTS_FILE, config, seed, torch_dtype, show_progress)
    if with_codec:
        write_codec_checkpoint(out, preset, seed, dtype, progress=show_progress)
    return out


def write_weights(path: Path, config: dict[str, Any], seed: int, dtype: torch.dtype,
                  show_progress: bool | None = None) -> None:
    """Stream every tensor of `plan_tensors(config)` into one safetensors file."""
    plans = plan_tensors(config)
    total_bytes = sum(plan.numel for plan in plans) * torch.empty((), dtype=dtype).element_size()
    if show_progress is None:
        show_progress = total_bytes >= _PROGRESS_MIN_BYTES
    progress = ProgressLine(f"writing {path.name}", total_bytes) if show_progress else None
    layout = [(plan.name, plan.shape) for plan in plans]
    write_safetensors(path, layout, dtype, lambda index: tensor_chunks(plans[index], seed), progress)
    if progress is not None:
        progress.finish()


def tensor_chunks(plan: TensorPlan, seed: int) -> Iterator[torch.Tensor]:
    """The values of one tensor in row blocks, each from a generator keyed by (seed, name, block)."""
    if plan.init == "ones":
        yield torch.ones(plan.shape)
        return
    if plan.init == "zeros":
        yield torch.zeros(plan.shape)
        return
    rows = plan.shape[0]
    row_size = plan.numel // rows if rows else 0
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(row_size, 1))
    for block, start in enumerate(range(0, rows, rows_per_chunk)):
        stop = min(rows, start + rows_per_chunk)
        generator = torch.Generator().manual_seed(_stream_seed(seed, plan.name, block))
        values = torch.randn((stop - start, *plan.shape[1:]), generator=generator).mul_(plan.std)
        if plan.scaled_row is not None and start <= plan.scaled_row < stop:
            values[plan.scaled_row - start].mul_(plan.row_gain)
        yield values


def _stream_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise CheckpointInitError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", "unknown_dtype")
    return DTYPES[dtype]


def _prepare_dir(out: Path, overwrite: bool) -> Path:
    if out.exists() and not out.is_dir():
        raise CheckpointInitError(f"{out} exists and is not a directory", "out_not_a_directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CheckpointInitError(f"{out} is not empty (pass --force to write into it anyway)", "out_not_empty")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
