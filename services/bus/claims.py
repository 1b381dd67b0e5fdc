"""Ownership by compare-and-set with epochs: decode owners of requests (`owner.<id>`), vocoder partitions (`part.<n>`).

A claim writes epoch 1 on an absent key, or epoch+1 over the exact revision the claimer read: of two racing
claimers exactly one wins; the other gets OwnershipConflict. The epoch goes into every codes message, so data from
an older owner can be told apart.
"""

from __future__ import annotations

import time

from nats.js.kv import KeyValue

from messages import subjects
from messages.records import OwnerRecord, PartitionOwner
from services.bus.kvstore import Versioned, read_record, write_record

OwnerClaim = Versioned[OwnerRecord]
PartitionClaim = Versioned[PartitionOwner]


async def read_owner(kv: KeyValue, request_id: str) -> OwnerClaim | None:
    """The request's current owner and its revision, or None when nobody claimed it."""
    return await read_record(kv, subjects.owner_key(request_id), OwnerRecord)


async def claim_request(kv: KeyValue, request_id: str, replica: str, *, current: OwnerClaim | None = None,
                        now: float | None = None) -> OwnerClaim:
    """Claim a request for `replica`: epoch 1 if unclaimed (`current` None), else take over `current` (epoch+1).

    Call before acking the request on REQUESTS. Raises OwnershipConflict if another claim landed first.
    """
    epoch = 1 if current is None else current.record.epoch + 1
    record = OwnerRecord(request_id=request_id, replica=replica, epoch=epoch,
                         claimed_at=time.time() if now is None else now)
    return await write_record(kv, subjects.owner_key(request_id), record, expected=current)


async def still_owner(kv: KeyValue, claim: OwnerClaim) -> bool:
    """True when `claim` is still the latest write of its key (nobody took the request over)."""
    latest = await read_owner(kv, claim.record.request_id)
    return latest is not None and latest.revision == claim.revision


async def read_partition(kv: KeyValue, partition: int) -> PartitionClaim | None:
    """The vocoder owning partition n and its revision, or None when unowned."""
    return await read_record(kv, subjects.partition_key(partition), PartitionOwner)


async def claim_partition(kv: KeyValue, partition: int, replica: str, *, current: PartitionClaim | None = None,
                          now: float | None = None) -> PartitionClaim:
    """Claim vocoder partition n for `replica` (epoch 1, or epoch+1 over `current`). OwnershipConflict if raced."""
    epoch = 1 if current is None else current.record.epoch + 1
    record = PartitionOwner(partition=partition, replica=replica, epoch=epoch,
                            claimed_at=time.time() if now is None else now)
    return await write_record(kv, subjects.partition_key(partition), record, expected=current)
