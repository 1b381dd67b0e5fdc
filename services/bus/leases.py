"""Liveness: each replica renews `lease.<replica>` every second; a lease older than its ttl means a dead replica."""

from __future__ import annotations

import asyncio
import logging
import time

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from messages import encode, subjects
from messages.errors import InvalidConfig
from messages.records import Lease
from services.bus.kvstore import read_record

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews one replica's lease until stopped; on a clean stop deletes it so others see the exit at once."""

    def __init__(self, kv: KeyValue, replica: str, service: str, *, interval_s: float = 1.0,
                 ttl_s: float = 3.0) -> None:
        if not 0 < interval_s < ttl_s:
            raise InvalidConfig(f"lease interval_s ({interval_s}) must be > 0 and below ttl_s ({ttl_s})")
        self._kv = kv
        self.key = subjects.lease_key(replica)
        self.replica = replica
        self.service = service
        self.interval_s = interval_s
        self.ttl_s = ttl_s

    async def renew(self) -> int:
        """Write a fresh lease now; returns the KV revision."""
        lease = Lease(replica=self.replica, service=self.service, renewed_at=time.time(), ttl_s=self.ttl_s)
        return await self._kv.put(self.key, encode(lease))

    async def run(self, stop: asyncio.Event) -> None:
        """Renew every interval until `stop` is set, then delete the lease."""
        while not stop.is_set():
            await self.renew()
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)  # the renewal period, woken early by stop
            except asyncio.TimeoutError:
                pass
        try:
            await self._kv.delete(self.key)
        except KeyNotFoundError:
            pass
        log.info("lease %s released", self.key)


async def read_lease(kv: KeyValue, replica: str) -> Lease | None:
    """The replica's last lease, or None if it never had one or left cleanly."""
    found = await read_record(kv, subjects.lease_key(replica), Lease)
    return found.record if found is not None else None


def lease_expired(lease: Lease | None, now: float | None = None) -> bool:
    """True when there is no lease or it was last renewed more than its ttl ago (clocks of one host or NTP)."""
    if lease is None:
        return True
    return (time.time() if now is None else now) - lease.renewed_at > lease.ttl_s


async def is_alive(kv: KeyValue, replica: str, now: float | None = None) -> bool:
    """Whether `replica` holds a live lease."""
    return not lease_expired(await read_lease(kv, replica), now)
