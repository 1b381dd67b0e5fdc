"""The gateway's view of the mesh's liveness, read from the `voxmesh` bucket: who holds a live lease, and whether
a vocoder partition's owner is alive. Used by `/ready` and by the supervisor."""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from nats.js.kv import KeyValue

from messages import DecodeError, decode
from messages import subjects
from messages.base import Message
from messages.records import Lease, PartitionOwner
from services.bus.claims import read_partition
from services.bus.leases import lease_expired, read_lease

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)


async def current_records(kv: KeyValue, pattern: str, kind: type[R]) -> list[R]:
    """Every current record whose key matches `pattern` (e.g. "lease.*"); unreadable ones are logged and skipped."""
    watcher = await kv.watch(pattern, ignore_deletes=True)
    found: list[R] = []
    try:
        async for entry in watcher:
            if entry is None:  # the watcher's marker: every current value has been delivered
                break
            if entry.value:
                try:
                    found.append(decode(entry.value, kind))
                except DecodeError as exc:
                    log.error("skipping unreadable %s: %s", entry.key, exc)
    finally:
        await watcher.stop()
    return found


async def live_replicas(kv: KeyValue, service: str, now: float | None = None) -> list[str]:
    """Replicas of `service` whose lease is live."""
    now = time.time() if now is None else now
    leases = await current_records(kv, subjects.all_lease_keys(), Lease)
    return sorted(lease.replica for lease in leases if lease.service == service and not lease_expired(lease, now))


async def live_partition_owners(kv: KeyValue, now: float | None = None) -> dict[int, str]:
    """Partition -> owning vocoder replica, for partitions whose owner holds a live lease."""
    now = time.time() if now is None else now
    leases = {lease.replica: lease for lease in await current_records(kv, subjects.all_lease_keys(), Lease)}
    owners = await current_records(kv, subjects.all_partition_keys(), PartitionOwner)
    return {owner.partition: owner.replica for owner in owners
            if not lease_expired(leases.get(owner.replica), now)}


async def partition_owner_alive(kv: KeyValue, partition: int, now: float | None = None) -> tuple[str | None, bool]:
    """The owner of `partition` (None when unowned) and whether its lease is live."""
    claim = await read_partition(kv, partition)
    if claim is None:
        return None, False
    replica = claim.record.replica
    return replica, not lease_expired(await read_lease(kv, replica), now)
