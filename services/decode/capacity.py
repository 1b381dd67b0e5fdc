"""How many requests decode may pull from REQUESTS now: free sequence slots, none while draining or out of KV."""

from __future__ import annotations

from services.bus.consumer import Capacity
from services.engine.engine import Engine


class EngineCapacity(Capacity):
    """The bus's Capacity (one slot per owned request, `max_num_seqs` slots), gated by the engine's state.

    No room while an operator drain is in progress (`pause`), or while the KV pool has no free block (a pulled
    request would only wait, owned by a replica that cannot run it, while another replica might).
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.config.max_num_seqs)
        self._engine = engine
        self.is_paused = False

    def room(self) -> int:
        if self.is_paused or self._engine.scheduler.block_manager.num_free_blocks == 0:
            return 0
        return super().room()

    def pause(self) -> None:
        self.is_paused = True

    def resume(self) -> None:
        self.is_paused = False
        self.nudge()
