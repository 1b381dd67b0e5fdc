"""How many requests decode may pull from REQUESTS now, and of which priority: free sequence slots, none while
draining or while the engine has no room; seats kept for interactive work, and one for batch work while it waits.

The guarantees (docs/scaling.md, "Priorities and fair share"):
- interactive: batch requests hold at most `max_num_seqs - interactive_seats` seats, so while fewer than
  `interactive_seats` interactive requests run, a seat is free and an interactive request is pulled at once (the
  engine admits it at its next step), however many batch requests wait or run;
- batch: while batch work waits and no batch request runs here, one seat is left to it (`floor_for`), so batch work
  progresses at least one request at a time on every replica, however many interactive requests wait.
"""

from __future__ import annotations

import asyncio

from services.bus.pull_consumer import Capacity
from services.engine.engine import Engine

BATCH = "batch"
BATCH_FLOOR = 1
"""Seats interactive work leaves to waiting batch work while none runs."""


class EngineCapacity(Capacity):
    """The bus's Capacity (one slot per owned request, `max_num_seqs` slots), gated by the engine's state.

    No room while an operator drain is in progress (`pause`), or while the engine says it has none
    (`Engine.has_room`: requests already waiting, a full batch, or no free KV block): a pulled request would only
    wait, owned by a replica that cannot run it, while another replica might.
    """

    def __init__(self, engine: Engine, interactive_seats: int = 0) -> None:
        super().__init__(engine.config.max_num_seqs)
        if not 0 <= interactive_seats < self.limit:
            raise ValueError(f"interactive_seats must be in [0, {self.limit}) (max_num_seqs {self.limit}: batch "
                             f"work needs a seat), got {interactive_seats}")
        self._engine = engine
        self.interactive_seats = interactive_seats
        self.num_batch = 0
        """Slots held by batch requests."""
        self.unpaused = asyncio.Event()
        """Clear while a drain holds the replica: a message a fetch already had in flight waits on it."""
        self.unpaused.set()

    @property
    def is_paused(self) -> bool:
        return not self.unpaused.is_set()

    def room(self) -> int:
        if self.is_paused or not self._engine.has_room():
            return 0
        return super().room()

    def room_for(self, kind: str | None) -> int:
        room = self.room()
        if kind == BATCH:
            room = min(room, self.limit - self.interactive_seats - self.num_batch)
        return max(0, room)

    def floor_for(self, kind: str | None) -> int:
        return max(0, BATCH_FLOOR - self.num_batch) if kind == BATCH else 0

    def take(self, kind: str | None = None) -> None:
        super().take(kind)
        if kind == BATCH:
            self.num_batch += 1

    def release(self, kind: str | None = None) -> None:
        super().release(kind)
        if kind == BATCH:
            self.num_batch -= 1

    def pause(self) -> None:
        self.unpaused.clear()

    def resume(self) -> None:
        self.unpaused.set()
        self.nudge()
