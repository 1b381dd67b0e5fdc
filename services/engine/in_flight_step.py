"""A step handed to the device: its codes on their way to the host, read once they have arrived.

The copy to the host is queued behind the step on the same stream, into pinned memory (so it does not wait for
the device when issued), and an event marks its end. Waiting on that event is the step's one synchronisation; the
engine does it only after the next step has been queued, so the device always has the next step to run.
"""

from __future__ import annotations

import torch

from services.engine.outputs import ModelRunnerOutput
from services.engine.sequence import NUM_CODEBOOKS


class InFlightStep:
    """The codes (and, when asked, hidden states) of one launched step; `result()` waits for them."""

    __slots__ = ("_request_ids", "_codes", "_hidden", "_eos_id", "begun", "arrived", "launch_s")

    def __init__(self, request_ids: list[str], codes: torch.Tensor, hidden: torch.Tensor | None, eos_id: int,
                 arrived: torch.cuda.Event | None, begun: torch.cuda.Event | None = None) -> None:
        self._request_ids, self._codes, self._hidden, self._eos_id = request_ids, codes, hidden, eos_id
        self.arrived = arrived
        """Recorded after the codes' copy (timed: `StepTimeline` reads it once `result()` has returned)."""
        self.begun = begun
        """Recorded before the step's first operation (`begin_on_device`), or None."""
        self.launch_s = 0.0
        """The host's time to build and queue the step (set by the engine once it is queued)."""

    @staticmethod
    def begin_on_device(device: torch.device) -> torch.cuda.Event | None:
        """The event a CUDA step records on its stream before its first operation (None elsewhere)."""
        if device.type != "cuda":
            return None
        begun = torch.cuda.Event(enable_timing=True)
        begun.record()
        return begun

    @classmethod
    def start(cls, request_ids: list[str], codes: torch.Tensor, eos_id: int,
              hidden: torch.Tensor | None = None, begun: torch.cuda.Event | None = None) -> InFlightStep:
        """Queue the copies of `codes` [B, 16] (and `hidden` [B, H] as float32) to the host (`begun`: see
        `begin_on_device`)."""
        if codes.device.type != "cuda":
            # Work on the CPU is done when the call returns; copy out of any static buffer all the same.
            return cls(request_ids, codes.clone(), None if hidden is None else hidden.float().clone(), eos_id, None)
        codes_host = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=True)
        codes_host.copy_(codes, non_blocking=True)
        hidden_host = None
        if hidden is not None:
            hidden_host = torch.empty(hidden.shape, dtype=torch.float32, pin_memory=True)
            hidden_host.copy_(hidden, non_blocking=True)
        arrived = torch.cuda.Event(enable_timing=True)
        arrived.record()
        return cls(request_ids, codes_host, hidden_host, eos_id, arrived, begun)

    @classmethod
    def empty(cls) -> InFlightStep:
        """A step that sampled no frame (only prefill chunks that did not finish)."""
        return cls([], torch.zeros((0, NUM_CODEBOOKS), dtype=torch.int64), None, 0, None)

    def result(self) -> ModelRunnerOutput:
        """The step's frames, once its codes are on the host (waits for the device only if they are not yet)."""
        if self.arrived is not None:
            self.arrived.synchronize()
        codes = self._codes
        return ModelRunnerOutput(request_ids=self._request_ids, codes=codes,
                                 is_eos=(codes[:, 0] == self._eos_id).tolist(), hidden=self._hidden)
