"""Engine and stage configuration: slotted dataclasses validated on construction."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.engine.errors import ConfigError


class PreemptionMode(enum.StrEnum):
    """What the talker stage does with a request the KV pool cannot hold (DESIGN.md, Preemption)."""

    ALLOW = "allow"
    """Free the victim's blocks, re-queue it, and replay it faithfully from its stored frames."""
    FAIL = "fail"
    """Free the victim's blocks and end it with one failed outcome, code `preempted`; never re-queue."""


class StageKind(enum.StrEnum):
    """The stages of the mesh; only autoregressive ones keep a KV cache that can be preempted."""

    TALKER = "talker"
    CODE_PREDICTOR = "code_predictor"
    VOCODER = "vocoder"
    PREFILL = "prefill"


AUTOREGRESSIVE_STAGES = frozenset({StageKind.TALKER})


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"EngineConfig.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Limits of one decode engine. Set the pool size by `kv_cache_blocks` or, on CUDA, `gpu_memory_fraction`."""

    kv_cache_blocks: int | None = None
    """Number of KV blocks in the pool (each holds every layer's K and V for `block_size` tokens)."""
    gpu_memory_fraction: float | None = None
    """On CUDA: size the pool to this fraction of the device memory free after loading the weights."""
    block_size: int = 16
    """Tokens per KV block."""
    max_num_seqs: int = 64
    """Most requests running (holding KV) at once."""
    max_num_batched_tokens: int = 2048
    """Most new tokens in one step (prefill chunks plus one per decoding request)."""
    max_model_len: int = 4096
    """Most tokens (prompt + frames) one request may reach; its frame budget is capped to fit."""
    cuda_graphs: bool = True
    """On CUDA: replay talker steps and frame sampling as CUDA graphs (bucketed token and row counts, all captured
    at start-up; one extra KV block is reserved as the padding tokens' scratch). Ignored on CPU."""
    overlap_steps: bool | None = None
    """Prepare step N+1 on the host while the device runs step N (`Engine.step` then returns step N's frames when
    it launches step N+1). None: on for CUDA, off elsewhere (on the CPU the work is done when it is launched)."""
    overlap_min_rows: int = 0
    """With `overlap_steps`: overlap only steps of at least this many rows; a smaller step is waited for and applied
    in its own call. Overlapping hides the host's launch behind the device, which pays at large batches; a request
    that arrives while a step runs joins the next launch, so without the overlap it meets one step in flight
    instead of two, and its first frame comes a step sooner. 0: every step overlaps."""
    late_launch: bool = False
    """With overlapped steps: queue the next step only when the one in flight is about to end (by the recent steps'
    device and launch times, `launch_pace`), or at once when a request arrives, instead of as soon as the one in flight
    began: a request that arrives while a step runs joins the next step, not the one after it."""

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            _positive_int(name, getattr(self, name))
        if (self.kv_cache_blocks is None) == (self.gpu_memory_fraction is None):
            raise ConfigError(
                "EngineConfig needs exactly one of kv_cache_blocks (any device) or gpu_memory_fraction (CUDA), "
                f"got kv_cache_blocks={self.kv_cache_blocks!r}, gpu_memory_fraction={self.gpu_memory_fraction!r}"
            )
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"EngineConfig.cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        if self.overlap_steps is not None and not isinstance(self.overlap_steps, bool):
            raise ConfigError(f"EngineConfig.overlap_steps must be True, False or None, got {self.overlap_steps!r}")
        if isinstance(self.overlap_min_rows, bool) or not isinstance(self.overlap_min_rows, int) \
                or self.overlap_min_rows < 0:
            raise ConfigError(f"EngineConfig.overlap_min_rows must be an int >= 0, got {self.overlap_min_rows!r}")
        if not isinstance(self.late_launch, bool):
            raise ConfigError(f"EngineConfig.late_launch must be True or False, got {self.late_launch!r}")
        if self.kv_cache_blocks is not None:
            _positive_int("kv_cache_blocks", self.kv_cache_blocks)
        if self.gpu_memory_fraction is not None:
            fraction = self.gpu_memory_fraction
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
                raise ConfigError(f"EngineConfig.gpu_memory_fraction must be in (0, 1], got {fraction!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running request needs one token per step"
            )


@dataclass(frozen=True, slots=True)
class StageConfig:
    """A stage's declaration. `recompute_preemption` exists only on autoregressive (talker) stages."""

    kind: StageKind
    """Which stage this configures."""
    recompute_preemption: PreemptionMode | None = None
    """`allow` or `fail` on the talker stage (None there means the default, allow); must be None elsewhere."""

    def __post_init__(self) -> None:
        try:
            kind = StageKind(self.kind)
        except ValueError:
            known = ", ".join(k.value for k in StageKind)
            raise ConfigError(f"StageConfig.kind must be one of {known}, got {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        if self.recompute_preemption is None:
            return
        if kind not in AUTOREGRESSIVE_STAGES:
            raise ConfigError(
                f"StageConfig.recompute_preemption is declared on the {kind.value} stage, which is not autoregressive; "
                "only the talker stage keeps a KV cache that can be preempted"
            )
        try:
            mode = PreemptionMode(self.recompute_preemption)
        except ValueError:
            raise ConfigError(
                f"StageConfig.recompute_preemption must be 'allow' or 'fail', got {self.recompute_preemption!r}"
            ) from None
        object.__setattr__(self, "recompute_preemption", mode)

    @property
    def preemption_mode(self) -> PreemptionMode:
        """The effective mode on an autoregressive stage: the declaration, else `allow`."""
        if self.kind not in AUTOREGRESSIVE_STAGES:
            raise ConfigError(f"the {self.kind.value} stage has no preemption mode")
        return self.recompute_preemption or PreemptionMode.ALLOW
