"""The operator drain (DESIGN.md, Preemption): an admin micro endpoint `drain` on each decode replica.

Inside the engine's drain scope nothing runs and nothing is pulled from REQUESTS: `allow` requests are queued for a
faithful replay when the scope ends (they announce Preempted, cause "drain", then Resumed); `fail` requests end at
once with CodesEnd failed `drained`. The scope is left, and intake resumed, even if the body raises.

Request body (JSON, optional): {"hold_s": seconds to stay drained, default 0}. Reply (JSON): {"replica", "drained":
[ids ended], "requeued": [ids to be replayed]}. Subject: `drain_subject(replica)`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

from nats.micro.request import Request, ServiceError

from messages import subjects
from messages.events import Preempted
from services.decode.core import DecodeCore, ending_of
from services.engine.engine import Engine
from services.engine.sequence import RequestOutcome

log = logging.getLogger(__name__)

def drain_subject(replica: str) -> str:
    """Per-replica admin subject of the drain endpoint: a drain names the replica it empties."""
    return subjects.admin("decode", replica, "drain")


class Drainer:
    """Handles drain requests; `stop` cuts a hold short when the service shuts down."""

    def __init__(self, core: DecodeCore, stop: asyncio.Event) -> None:
        self.core = core
        self.stop = stop
        self.num_drains = 0

    async def handle(self, request: Request) -> None:
        """The micro endpoint handler."""
        hold_s = _hold_seconds(request.data)
        result = await self.drain(hold_s)
        await request.respond(json.dumps(result).encode())

    async def drain(self, hold_s: float = 0.0) -> dict[str, Any]:
        """Enter the engine's drain scope, hold it `hold_s` seconds, leave it; returns what happened."""
        core = self.core
        core.capacity.pause()
        scope = core.engine.drain()
        try:
            ended, requeued = await core.worker.run(_enter, core.engine, scope)
            try:
                self.num_drains += 1
                log.info("drain: %d requests re-queued for replay, %d ended (drained)", len(requeued), len(ended))
                await self._announce(ended, requeued)
                if hold_s > 0:
                    await _wait(self.stop, hold_s)
            finally:
                await core.worker.run(scope.__exit__, None, None, None)
        finally:
            core.capacity.resume()
            core.wake()
        return {"replica": core.replica, "drained": [o.request_id for o in ended], "requeued": requeued}

    async def _announce(self, ended: list[RequestOutcome], requeued: list[str]) -> None:
        core = self.core
        for request_id in requeued:
            active = core.active.get(request_id)
            if active is not None:
                active.is_preempted = True
                await core.emit(Preempted(request_id=request_id, at=core.now(), replica=core.replica,
                                          frames_done=active.stream.num_frames, cause="drain"))
        for outcome in ended:
            active = core.active.get(outcome.request_id)
            if active is not None:
                await core.emit(Preempted(request_id=outcome.request_id, at=core.now(), replica=core.replica,
                                          frames_done=active.stream.num_frames, cause="drain"))
                await core.end(active, ending_of(outcome))


def _enter(engine: Engine, scope) -> tuple[list[RequestOutcome], list[str]]:
    """(On the engine thread.) Enter the scope; the outcomes it ended and the running requests it re-queued."""
    running = engine.running_ids()
    ended = scope.__enter__()
    ended_ids = {outcome.request_id for outcome in ended}
    return ended, [request_id for request_id in running if request_id not in ended_ids]


def _hold_seconds(data: bytes) -> float:
    if not data.strip():
        return 0.0
    try:
        body = json.loads(data)
        hold = float(body.get("hold_s", 0.0)) if isinstance(body, dict) else None
    except (ValueError, TypeError):
        hold = None
    if hold is None or not math.isfinite(hold) or not 0 <= hold <= 3600:
        raise ServiceError("400", 'drain takes an optional JSON body {"hold_s": seconds in [0, 3600]}')
    return hold


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Hold the drain for `seconds` (an operator's choice, not a synchronisation), or until shutdown."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass
