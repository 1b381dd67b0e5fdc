"""Migration, the gateway's side: a request whose decode owner died goes back on REQUESTS.

REQUESTS is a work queue and decode acks a request once it has claimed it, so the request itself is gone from the
bus while a replica serves it; the gateway that admitted it still holds it, and watches it until its terminal event.
When the owner's lease (`owner.<id>` names the owner) is dead, the supervisor puts the same request on REQUESTS
again, once per dead owner epoch (its Msg-Id says which: `<id>:requeue:e<epoch>`), without its queue deadline: it
left the queue long ago. Whichever decode replica with room pulls it takes the claim over and continues from the
frames in CODES (services/decode/migration.py has the whole design); a replica taking it over past the migration
limit ends it `replica_lost` instead. If no decode replica takes it, the vocoder ends it `replica_lost` after its
migration grace; a later pull of the requeued copy sees the terminal and leaves it.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages.records import OwnerRecord
from messages.requests import SynthesisRequest
from services.bus.claims import read_owner
from services.bus.errors import QueueFull
from services.bus.leases import is_alive
from services.bus.submit import submit_request

log = logging.getLogger(__name__)


class LeaseMemo:
    """Replica liveness read once per supervision pass, however many requests a replica owns."""

    def __init__(self, kv: KeyValue, now: float) -> None:
        self._kv, self._now = kv, now
        self._alive: dict[str, bool] = {}

    async def is_alive(self, replica: str) -> bool:
        if replica not in self._alive:
            self._alive[replica] = await is_alive(self._kv, replica, self._now)
        return self._alive[replica]


class DeadOwnerRequeue:
    """Requeues the watched requests whose decode owner is dead. Call `check` on each supervision pass."""

    def __init__(self, js: JetStreamContext, kv: KeyValue) -> None:
        self._js, self._kv = js, kv
        self._owners: dict[str, OwnerRecord] = {}
        """The owner each request last had; while it lives, a pass needs no read of `owner.<id>`."""
        self._requeued: dict[str, int] = {}
        """The owner epoch each request was last requeued for."""
        self.num_requeued = 0

    async def check(self, request: SynthesisRequest, leases: LeaseMemo) -> None:
        """Requeue `request` if its decode owner is dead and it was not requeued for that owner yet."""
        owner = self._owners.get(request.id)
        if owner is not None and await leases.is_alive(owner.replica):
            return
        claim = await read_owner(self._kv, request.id)
        if claim is None:
            return  # still queued: the queue deadline governs it
        owner = self._owners[request.id] = claim.record
        if await leases.is_alive(owner.replica) or self._requeued.get(request.id, 0) >= owner.epoch:
            return
        again = msgspec.structs.replace(request, deadline=None)
        try:
            await submit_request(self._js, again, msg_id=f"{request.id}:requeue:e{owner.epoch}")
        except (QueueFull, nats.errors.Error, asyncio.TimeoutError) as exc:
            log.warning("its decode owner %s died, but requeuing it failed (%r); trying again next pass",
                        owner.replica, exc)
            return
        self._requeued[request.id] = owner.epoch
        self.num_requeued += 1
        log.warning("its decode owner %s (epoch %d) died; requeued it for a live decode replica to take over",
                    owner.replica, owner.epoch)

    def forget(self, request_id: str) -> None:
        """The request ended (or is no longer watched here)."""
        self._owners.pop(request_id, None)
        self._requeued.pop(request_id, None)
