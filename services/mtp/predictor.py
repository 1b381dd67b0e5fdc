"""A replica's code predictor: the loaded checkpoint, its fingerprint, and one step's computation.

It loads the whole checkpoint with `load_model` (talker included: the loader builds both modules together and has no
predictor-only path yet), then serves only `predict_rest`, the same function decode runs locally, so a remote step
gives the codes a local one would; on CUDA as graphs over padded rows (`padded_rest.py`), the shapes decode's own
graphs run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from messages.errors import ErrorCode
from messages.mtp import StepRequest
from services.engine.model_ops import predict_rest
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.model.kernel_choices import KernelChoices
from services.model.loader import TTSModel, load_model
from services.model.sampling import SamplingParamsError
from services.mtp.errors import StepRefused
from services.mtp.padded_rest import PaddedRestPredictor
from services.mtp.step_rows import DTYPE_NAMES, StepRows, codes_bytes


@dataclass(frozen=True, slots=True)
class LoadedPredictor:
    """The model a replica serves and the fingerprint every step must carry."""

    model: TTSModel
    fingerprint: str
    padded: PaddedRestPredictor | None = None
    """The graphed steps (CUDA), or None: every step eager."""

    @staticmethod
    def load(model_dir: str | Path, dtype: torch.dtype, device: str, graph_rows: int | None = None,
             choices: KernelChoices = KernelChoices()) -> LoadedPredictor:
        """(On the worker thread.) Load the checkpoint, its layers taking the kernels `choices` allow; CheckpointError
        names the file at fault. On CUDA with `graph_rows`, capture the steps of up to that many rows now, before the
        replica serves."""
        model = load_model(model_dir, dtype=dtype, device=device, choices=choices)
        padded = None
        if graph_rows is not None and model.device.type == "cuda":
            padded = PaddedRestPredictor(model, graph_rows)
            padded.prepare_all()
        return LoadedPredictor(model, checkpoint_fingerprint(model_dir), padded)

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.model.dtype]

    def check(self, step: StepRequest) -> None:
        """Refuse a step this model cannot serve faithfully (StepRefused names why); cheap, on the event loop."""
        if step.fingerprint != self.fingerprint:
            raise StepRefused(ErrorCode.FINGERPRINT_MISMATCH, f"step made for checkpoint {step.fingerprint}, this "
                                                              f"replica serves {self.fingerprint}")
        if step.hidden_dtype != self.dtype_name:
            raise StepRefused(ErrorCode.FINGERPRINT_MISMATCH, f"hidden states are {step.hidden_dtype}, this replica's "
                                                              f"weights are {self.dtype_name}: the codes would differ")
        width = self.model.config.talker.decoder.hidden_size
        if step.hidden_size != width:
            raise StepRefused(ErrorCode.INVALID_REQUEST, f"hidden_size {step.hidden_size}, the talker's is {width}")
        vocab = self.model.config.talker.vocab_size
        if any(not 0 <= c < vocab for c in step.c0):
            raise StepRefused(ErrorCode.INVALID_REQUEST, f"c0 {step.c0} has ids outside [0, {vocab})")

    def compute(self, step: StepRequest) -> bytes:
        """(On the worker thread.) Codebooks 1..15 of the step's rows, as the reply's bytes: one `predict_rest`."""
        try:
            rows = StepRows.unpack(step, self.model.device)
        except SamplingParamsError as bad:
            raise StepRefused(ErrorCode.INVALID_REQUEST, str(bad)) from bad
        with torch.inference_mode():
            if self.padded is not None:
                return codes_bytes(self.padded.predict(rows.hidden, rows.c0, rows.sampling))
            return codes_bytes(predict_rest(self.model, rows.hidden, rows.c0, rows.sampling))
