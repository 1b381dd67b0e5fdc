"""Write a `.safetensors` file tensor by tensor, chunk by chunk, without holding the model in memory.

The header (names, dtypes, shapes, byte offsets) is known from shapes alone, so it is written
first and the data follows in header order; a 1.7B checkpoint is then never more than one chunk
in memory. The file appears under its final name only once complete (written to `.partial`, then
renamed), so an interrupted write never leaves a truncated model behind.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import torch

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


class ProgressLine:
    """A one-line progress report on stderr (`label: 42% (1.5 of 3.6 GB)`), redrawn at most 4 times a second."""

    def __init__(self, label: str, total_bytes: int, stream: TextIO | None = None) -> None:
        self.label, self.total, self.done = label, max(total_bytes, 1), 0
        self.stream = stream if stream is not None else sys.stderr
        self._last_draw = 0.0

    def advance(self, num_bytes: int) -> None:
        self.done += num_bytes
        now = time.monotonic()
        if now - self._last_draw >= 0.25 or self.done >= self.total:
            self._last_draw = now
            gb = 1024**3
            self.stream.write(
                f"\r{self.label}: {100 * self.done // self.total:3d}% ({self.done / gb:.2f} of {self.total / gb:.2f} GB)"
            )
            self.stream.flush()

    def finish(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _header(layout: Sequence[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> tuple[bytes, int]:
    item = torch.empty((), dtype=dtype).element_size()
    entries: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in layout:
        size = math.prod(shape) * item
        entries[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return text, offset


def write_safetensors(
    path: str | Path,
    layout: Sequence[tuple[str, tuple[int, ...]]],
    dtype: torch.dtype,
    chunks: Callable[[int], Iterator[torch.Tensor]],
    progress: ProgressLine | None = None,
) -> None:
    """Write tensors `layout[i] = (name, shape)` whose values `chunks(i)` yields in row-major pieces.

    Chunks are cast to `dtype`; together they must hold exactly the tensor's element count.
    """
    if dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(map(str, SAFETENSORS_DTYPES))}")
    names = [name for name, _ in layout]
    if len(set(names)) != len(names):
        raise ValueError("tensor names in a safetensors file must be unique")
    header, _ = _header(layout, dtype)
    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    try:
        with open(partial, "wb") as out:
            out.write(len(header).to_bytes(8, "little"))
            out.write(header)
            for index, (name, shape) in enumerate(layout):
                _write_tensor(out, name, math.prod(shape), dtype, chunks(index), progress)
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)


def _write_tensor(out, name: str, numel: int, dtype: torch.dtype, pieces: Iterator[torch.Tensor],
                  progress: ProgressLine | None) -> None:
    written = 0
    for piece in pieces:
        flat = piece.detach().to(device="cpu", dtype=dtype).contiguous().reshape(-1)
        written += flat.numel()
        if written > numel:
            raise ValueError(f"tensor {name!r}: chunks hold more than its {numel} elements")
        data = flat.view(torch.uint8).numpy()  # raw little-endian bytes, bfloat16 included
        out.write(data.data)
        if progress is not None:
            progress.advance(data.nbytes)
    if written != numel:
        raise ValueError(f"tensor {name!r}: chunks hold {written} elements, expected {numel}")
