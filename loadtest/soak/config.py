"""What one soak runs: its durations, its load (an open-loop rate or closed-loop clients), the mesh's and the bench's
extra flags, and the window the latency verdict compares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class SoakArgsError(ValueError):
    """Flags that cannot make a soak (both load modes, a flag the soak sets itself, a non-positive duration)."""

    code = "invalid_soak_args"


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """What the soak runs.

    Attributes:
        duration_s: seconds of load between the two samples.
        warmup_s: seconds of load before the first sample (allocators, caches and CUDA graphs settle).
        concurrency: closed-loop clients of `voxmesh bench` (used when `rate` is None).
        fixed_frames: frames per request (the tiny model's random weights rarely end on their own); sent only when
            `bench_args` pick no length of their own (`--length-mode` or `--fixed-frames`).
        work_dir: the mesh's state, its log and the bench's own JSON (every request), kept for a look afterwards.
        rate: open-loop Poisson arrivals per second instead of the closed loop; None runs the closed loop.
        up_args: extra flags for the soak's `voxmesh up` (a model, a device, engine sizes).
        bench_args: extra flags for every `voxmesh bench` the soak runs (transport, length mode, prompts).
        window_s: the latency verdict compares the requests started in the level's first and last `window_s`.
        start_timeout_s: the longest wait for `voxmesh up` to serve (a GPU mesh loads a model and captures graphs).
    """

    duration_s: float
    warmup_s: float
    concurrency: int
    fixed_frames: int
    work_dir: Path
    rate: float | None = None
    up_args: tuple[str, ...] = ()
    bench_args: tuple[str, ...] = ()
    window_s: float = 60.0
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("duration_s", "warmup_s", "concurrency", "fixed_frames", "window_s", "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise SoakArgsError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rate is not None and not self.rate > 0:
            raise SoakArgsError(f"rate must be positive, got {self.rate}")

    @property
    def is_open_loop(self) -> bool:
        return self.rate is not None

    def describe_load(self) -> str:
        """`open loop at 28/s` or `closed loop x4`, as the documents say it."""
        return f"open loop at {self.rate:g}/s" if self.rate is not None else f"closed loop x{self.concurrency}"
