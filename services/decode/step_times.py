"""The engine's step times as decode keeps them: one `Timings` a part of the engine's `StepTimeline`, filled by the
timeline on the engine thread and read into STATS (`step_seconds`) and /metrics (`voxmesh_step_seconds`)."""

from __future__ import annotations

from services.engine.step_timeline import PARTS
from services.metrics.timings import Timings

STEP_BOUNDS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.030, 0.050, 0.100)
"""Seconds, for the histogram: a step of the presets takes 1-20 ms."""


class StepTimes:
    """Observed step times by part; `record` is the timeline's sink (one deque append: no lock needed)."""

    def __init__(self) -> None:
        self.timings = {part: Timings(STEP_BOUNDS) for part in PARTS}

    def record(self, part: str, seconds: float) -> None:
        self.timings[part].observe(seconds)
