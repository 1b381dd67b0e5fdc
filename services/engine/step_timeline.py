"""Where each step's time goes on the device, read from two CUDA events a launched step records.

A step records `begun` on its stream before its first operation and `arrived` after the copy of its codes. Once its
codes are on the host both have completed, and the events give, at no cost to the step:

- device: `begun` -> `arrived`, the step on the device from the moment the stream reached it. It holds the step's
  kernels, the time the card gave to another process meanwhile (the vocoder time-slices the same card), and any wait
  for the host to launch the step's later kernels;
- idle: the previous step's `arrived` -> this step's `begun`, the stream with nothing to run: the engine thread (or
  the event loop feeding it) was late with the next step. Zero when the step was queued before the previous one
  ended, as the overlapped loop means it to be.

Split by kind (steps that sample only decode rows, and mixed ones that also carry a prompt's prefill chunk), with the
host's time to build and launch a step beside them (every step's, and the mixed ones' alone: `launch_mixed`), these
say whether a mesh's step rate is bound by the card, by the card's other tenant, or by the host (decode's STATS
`step_seconds`; loadtest/gpu/gpu_mesh_table.py prints them).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

PARTS = ("device_decode", "device_mixed", "idle", "launch", "launch_mixed")
"""The times a timeline reports, by name."""

Record = Callable[[str, float], None]
"""Takes one observation: (part, seconds)."""

SLOW_STEP_S = 0.1
"""A step this long on the device (over ten times a batch-64 step's) is logged with what it held: such a step stalls
every stream in it, and the histogram alone cannot say which step it was or what it carried."""

_log = logging.getLogger(__name__)


def _ignored(part: str, seconds: float) -> None:
    pass


class StepTimeline:
    """Device and host times of the steps applied so far (device times of CUDA steps only: a CPU step records no
    events), handed to `record` as they are known (the decode service keeps them in its STATS)."""

    def __init__(self, record: Record = _ignored) -> None:
        self.record = record
        self._last_arrived: torch.cuda.Event | None = None

    def launched(self, seconds: float) -> None:
        """The host took `seconds` to build and queue a step."""
        self.record("launch", seconds)

    def applied(self, begun: torch.cuda.Event | None, arrived: torch.cuda.Event | None, *, mixed: bool,
                rows: int = 0, tokens: int = 0, launch_s: float = 0.0) -> None:
        """A step's codes are on the host (both events complete): its device time and the idle time before it.
        `rows`, `tokens` (the step's sequences and tokens) and `launch_s` (the host's time to queue it) only describe
        a slow step in the log: a long launch is the host's (a compile, a lock), the rest the card's; a mixed step's
        `launch_s` is also kept apart (`launch_mixed`), as a mixed step on the device may be one the host was slow to
        queue."""
        if mixed:
            self.record("launch_mixed", launch_s)
        if begun is None or arrived is None:
            return
        device_s = begun.elapsed_time(arrived) / 1000
        self.record("device_mixed" if mixed else "device_decode", device_s)
        if device_s >= SLOW_STEP_S:
            _log.warning("a %s step of %d sequences and %d tokens took %.0f ms on the device, %.0f ms of it "
                         "launching on the host", "mixed" if mixed else "decode", rows, tokens, device_s * 1000,
                         launch_s * 1000)
        if self._last_arrived is not None:
            # Steps are applied in launch order on one stream, so the previous step's event has completed too.
            self.record("idle", max(0.0, self._last_arrived.elapsed_time(begun)) / 1000)
        self._last_arrived = arrived

    def restart(self) -> None:
        """No step is in flight (a drain, an idle loop): the next step's wait is not the stream's idleness."""
        self._last_arrived = None
