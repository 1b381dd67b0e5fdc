"""Ownership by compare-and-set with epochs: decode owners of requests (`owner.<id>`), vocoder partitions (`part.<n>`).

A claim writes epoch 1 on an absent key, or epoch+1 over the exact revision the claimer read: of two racing
claimers exactly one wins; the other gets OwnershipConflict. The epoch goes into every codes message, so data from
an older owner can be told apart.

A request whose `owner.<id>` already exists is never dropped on that alone (`resolve_request_claim`): this replica's
own claim is continued, a dead owner's is taken over, and only a live other owner's is left alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.js.kv import KeyValue

from messages import subjects
from messages.records import OwnerRecord, PartitionOwner
from services.bus.errors import OwnershipConflict
from services.bus.kvstore import Versioned, read_record, write_record
from services.bus.leases import is_alive

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


class ClaimKind(enum.Enum):
    """How a replica stands with a request it was delivered."""

    NEW = "new"  # nobody had claimed it: epoch 1, ours
    OURS = "ours"  # this replica had claimed it already (a redelivery): ours, at the recorded epoch
    TAKEN_OVER = "taken_over"  # its owner's lease is dead: ours now, epoch + 1 over the recorded revision
    LIVE_OWNER = "live_owner"  # another replica owns it and is alive: leave it alone
    DEAD_OWNER_KEPT = "dead_owner_kept"  # its owner is dead, and the caller declined to take it over (it ended)


@dataclass(frozen=True, slots=True)
class RequestClaim:
    """The outcome of `resolve_request_claim`: how we stand, and the owner record in force."""

    kind: ClaimKind
    claim: OwnerClaim
    previous: OwnerClaim | None = None  # the dead owner's claim that a TAKEN_OVER replaced

    @property
    def is_ours(self) -> bool:
        return self.kind in (ClaimKind.NEW, ClaimKind.OURS, ClaimKind.TAKEN_OVER)


TakeoverCheck = Callable[[OwnerClaim], Awaitable[bool]]

MAX_CLAIM_ROUNDS = 3  # each lost race means another replica just wrote the key; the next read shows who


async def resolve_request_claim(kv: KeyValue, request_id: str, replica: str, *,
                                may_take_over: TakeoverCheck | None = None) -> RequestClaim:
    """Claim a delivered request, resolving an existing `owner.<id>` by its owner's lease.

    A dead owner's claim is taken over only if `may_take_over(claim)` agrees (None: always). Raises
    OwnershipConflict when the key kept changing under us for MAX_CLAIM_ROUNDS reads.

    Most deliveries are a request's first, whose key is absent: the create is tried before any read (one round trip
    on the request's path instead of two); a key already there refuses it, and the read below resolves who holds it."""
    try:
        return RequestClaim(ClaimKind.NEW, await claim_request(kv, request_id, replica))
    except OwnershipConflict:
        pass
    for _ in range(MAX_CLAIM_ROUNDS):
        current = await read_owner(kv, request_id)
        try:
            if current is None:
                return RequestClaim(ClaimKind.NEW, await claim_request(kv, request_id, replica))
            owner = current.record.replica
            if owner == replica:
                return RequestClaim(ClaimKind.OURS, current)
            if await is_alive(kv, owner):
                return RequestClaim(ClaimKind.LIVE_OWNER, current)
            if may_take_over is not None and not await may_take_over(current):
                return RequestClaim(ClaimKind.DEAD_OWNER_KEPT, current)
            taken = await claim_request(kv, request_id, replica, current=current)
            return RequestClaim(ClaimKind.TAKEN_OVER, taken, previous=current)
        except OwnershipConflict:
            continue  # another replica wrote the key between our read and our write: read again
    raise OwnershipConflict(f"owner.{request_id} changed {MAX_CLAIM_ROUNDS} times while {replica} resolved it")


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
