"""How many requests decode may pull from REQUESTS now: free sequence slots, none while draining or while the engine
has no room."""

from __future__ import annotations

import asyncio

from services.bus.pull_consumer import Capacity
from services.engine.engine import Engine


class EngineCapacity(Capacity):
    """The bus's Capacity (one slot per owned request, `max_num_seqs` slots), gated by the engine's state.

    No room while an operator drain is in progress (`pause`), or while the engine says it has none
    (`Engine.has_room`: requests already waiting, a full batch, or no free KV block): a pulled request would only
    wait, owned by a replica that cannot run it, while another replica might.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.config.max_num_seqs)
        self._engine = engine
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

    def pause(self) -> None:
        self.unpaused.clear()

    def resume(self) -> None:
        self.unpaused.set()
        self.nudge()
