"""The gateway's view of the mesh's liveness, read from the `voxmesh` bucket: who holds a live lease, and whether
a vocoder partition's owner is alive. Used by `/ready` and by the supervisor (which replicas of a service are live:
`services.bus.leases.live_replicas`)."""

from __future__ import annotations

import time

from nats.js.kv import KeyValue

from messages import subjects
from messages.records import Lease, PartitionOwner
from services.bus.claims import read_partition
from services.bus.kvstore import current_records
from services.bus.leases import lease_expired, read_lease


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
