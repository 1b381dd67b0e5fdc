"""Counters of the decode service and its engine's step times, reported in its micro service STATS
(`$SRV.STATS.voxmesh-decode`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from services.engine.engine import Engine
from services.engine.step_timeline import PARTS
from services.metrics.timings import Timings

STEP_BOUNDS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.030, 0.050, 0.100)
"""Seconds, for the histogram: a step of the presets takes 1-20 ms."""


class StepSeconds:
    """The engine's step times by part (`StepTimeline.PARTS`), as STATS `step_seconds` and /metrics
    `voxmesh_step_seconds` read them; `record` is the engine's step sink, called on the engine thread (one deque
    append: no lock needed)."""

    def __init__(self) -> None:
        self.timings = {part: Timings(STEP_BOUNDS) for part in PARTS}

    def record(self, part: str, seconds: float) -> None:
        self.timings[part].observe(seconds)


@dataclass(slots=True)
class DecodeStats:
    """Counts since start. Batch size is the number of requests that produced a frame in one engine step."""

    requests_started: int = 0
    requests_finished: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    requests_invalid: int = 0
    requests_stood_down: int = 0
    """Fenced out by a newer owner: stopped locally, no CodesEnd (the new owner ends the request)."""
    requests_migrated: int = 0
    """Taken over from a dead decode replica and continued here from the frames it left in CODES."""
    preemptions: int = 0
    steps: int = 0
    frames: int = 0
    last_batch_size: int = 0
    max_batch_size: int = 0
    step_errors: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    """Requests ended with an error here (cancelled and invalid included), by error code (for /metrics)."""

    def record_failure(self, code: str) -> None:
        self.failures_by_code[code] = self.failures_by_code.get(code, 0) + 1

    def record_step(self, batch_size: int) -> None:
        self.steps += 1
        self.frames += batch_size
        self.last_batch_size = batch_size
        self.max_batch_size = max(self.max_batch_size, batch_size)

    def report(self, engine: Engine, num_active: int, messages_termed: int) -> dict[str, Any]:
        """Counters plus the engine's present state. Read from the event loop while the engine thread works: each
        number is a plain read of a size, so the worst case is a value one step old."""
        now = engine.stats()
        return {
            **asdict(self),
            "active_requests": num_active,
            "active_sequences": now.num_unfinished,
            "running_sequences": now.num_running,
            "waiting_sequences": now.num_waiting,
            "kv_blocks_total": now.num_kv_blocks,
            "kv_blocks_in_use": now.num_used_kv_blocks,
            "is_draining": now.is_draining,
            "messages_termed": messages_termed,
            "graph_capture_failures": now.num_graph_capture_failures,
        }
