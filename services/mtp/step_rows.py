"""A code-predictor step between tensors and its StepRequest: the client packs rows, a replica unpacks them.

Both sides go through this one module, so what a replica computes from a request is exactly what the caller would
have computed locally: the same hidden states (bit for bit, in the caller's dtype), codebook 0, and the sampling
rows `RowSampling.build` makes from the same parameters, seeds and frame indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from messages.mtp import HiddenDtype, StepRequest
from services.model.sampling import RowSampling, SamplingParams

DTYPE_NAMES: dict[torch.dtype, HiddenDtype] = {torch.float32: "float32", torch.float16: "float16",
                                               torch.bfloat16: "bfloat16"}
DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}
NUM_REST_CODEBOOKS = 15


class StepRowsError(ValueError):
    """Rows that cannot make a StepRequest (a dtype the wire does not carry, mismatched lengths)."""


def pack_step(fingerprint: str, step_id: int, hidden: torch.Tensor, c0: torch.Tensor, seeds: Sequence[int],
              frames: Sequence[int], params: Sequence[SamplingParams]) -> StepRequest:
    """The StepRequest of B rows: hidden [B, H] (float32/float16/bfloat16), c0 [B], one seed, frame index and
    SamplingParams per row. Copies the tensors to the host (a device sync where they live on a GPU)."""
    if hidden.dim() != 2 or hidden.dtype not in DTYPE_NAMES:
        raise StepRowsError(f"hidden must be [B, H] float32, float16 or bfloat16, got {tuple(hidden.shape)} "
                            f"{hidden.dtype}")
    rows, width = hidden.shape
    if c0.shape != (rows,) or not len(seeds) == len(frames) == len(params) == rows:
        raise StepRowsError(f"c0 {tuple(c0.shape)}, {len(seeds)} seeds, {len(frames)} frames and {len(params)} "
                            f"params must all have the {rows} rows of hidden")
    raw = hidden.detach().contiguous().cpu()
    if raw.dtype == torch.bfloat16:  # numpy has no bfloat16: its 16-bit pattern travels
        raw = raw.view(torch.int16)
    array = raw.numpy()
    return StepRequest(
        fingerprint=fingerprint, step_id=step_id, num_rows=rows, hidden_size=width,
        hidden_dtype=DTYPE_NAMES[hidden.dtype], hidden=array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes(),
        c0=[int(c) for c in c0.tolist()], seeds=[int(s) for s in seeds], frames=[int(f) for f in frames],
        temperature=[float(p.temperature) for p in params], top_k=[int(p.top_k) for p in params],
        top_p=[float(p.top_p) for p in params])


@dataclass(frozen=True, slots=True)
class StepRows:
    """A StepRequest's rows as tensors on a replica's device, ready for `predict_rest`."""

    hidden: torch.Tensor
    """[B, H] in the request's dtype."""
    c0: torch.Tensor
    """int64 [B]."""
    sampling: RowSampling

    @staticmethod
    def unpack(step: StepRequest, device: torch.device | str) -> StepRows:
        """Raises SamplingParamsError for out-of-range sampling parameters (the caller's fault)."""
        params = [SamplingParams(temperature=t, top_k=k, top_p=p)
                  for t, k, p in zip(step.temperature, step.top_k, step.top_p)]
        dtype = DTYPES[step.hidden_dtype]
        wire = torch.int16 if dtype == torch.bfloat16 else dtype
        hidden = torch.frombuffer(bytearray(step.hidden), dtype=wire).view(dtype).reshape(step.num_rows,
                                                                                          step.hidden_size)
        c0 = torch.tensor(step.c0, dtype=torch.int64)
        return StepRows(hidden.to(device), c0.to(device), RowSampling.build(params, step.seeds, step.frames, device))


def codes_bytes(codes: torch.Tensor) -> bytes:
    """Codebooks 1..15 [B, 15] as the reply's int16 little-endian bytes."""
    return codes.to(torch.int64).cpu().numpy().astype("<i2").tobytes()


def codes_tensor(rows: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A reply's codes (int64 [B, 15], `StepReply.rows()`) on `device`."""
    return torch.from_numpy(rows).to(device)
