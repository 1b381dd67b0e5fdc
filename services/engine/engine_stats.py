"""What the engine says about itself (vLLM's scheduler interface: request counts, KV cache usage, stats), so no
caller reads the scheduler's queues or the block manager."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's state at one moment.

    Attributes:
        num_waiting: requests queued, not running (new, or preempted and waiting for their replay).
        num_running: requests in the running batch.
        num_kv_blocks: blocks of the KV pool.
        num_free_kv_blocks: blocks no request holds.
        is_draining: an operator drain scope is open (nothing runs).
        num_graph_capture_failures: CUDA graphs that could not be captured and run eagerly instead.
    """

    num_waiting: int
    num_running: int
    num_kv_blocks: int
    num_free_kv_blocks: int
    is_draining: bool
    num_graph_capture_failures: int = 0

    @property
    def num_unfinished(self) -> int:
        """Requests the engine holds (waiting or running)."""
        return self.num_waiting + self.num_running

    @property
    def num_used_kv_blocks(self) -> int:
        return self.num_kv_blocks - self.num_free_kv_blocks

    @property
    def kv_usage(self) -> float:
        """The fraction of the KV pool in use, 0.0..1.0."""
        return self.num_used_kv_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0
