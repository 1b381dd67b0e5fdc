"""Values of the `voxmesh` KV bucket: ownership, leases, vocoder partitions, cancellation."""

from __future__ import annotations

from messages.base import Message, NonNegInt, ReplicaName, RequestId, Seconds, UnixTime
from messages.errors import ErrorCode


class OwnerRecord(Message, tag="owner", kw_only=True, frozen=True):
    """`owner.<id>`: the decode replica that owns a request. Written only by compare-and-set with a new epoch.

    Attributes:
        request_id: the request.
        replica: the owning decode replica.
        epoch: 1 for the first claim, +1 for each takeover.
        claimed_at: unix time of the claim.
    """

    request_id: RequestId
    replica: ReplicaName
    epoch: NonNegInt
    claimed_at: UnixTime


class Lease(Message, tag="lease", kw_only=True, frozen=True):
    """`lease.<replica>`: renewed each second; a replica whose lease is older than a few seconds is dead.

    Attributes:
        replica: the replica.
        service: its service (gateway, decode, vocoder, mtp, prefill).
        renewed_at: unix time of this renewal (the sender's clock; readers judge age by the KV entry's own
            server timestamp where they can).
        ttl_s: seconds after which readers may call it dead.
    """

    replica: ReplicaName
    service: str
    renewed_at: UnixTime
    ttl_s: Seconds = 3.0


class PartitionOwner(Message, tag="partition_owner", kw_only=True, frozen=True):
    """`part.<n>`: the vocoder replica that owns partition n. Claimed by compare-and-set with a new epoch.

    Attributes:
        partition: the partition.
        replica: the owning vocoder replica.
        epoch: 1 for the first claim, +1 for each takeover.
        claimed_at: unix time of the claim.
    """

    partition: NonNegInt
    replica: ReplicaName
    epoch: NonNegInt
    claimed_at: UnixTime


class CancelRecord(Message, tag="cancel", kw_only=True, frozen=True):
    """`cancel.<id>`: the gateway cancelled a request; every stage stops work for it.

    Attributes:
        request_id: the request.
        code: `cancelled` (client) or `timeout` (resume window or deadline passed).
        reason: for a person.
        at: unix time of the cancel.
    """

    request_id: RequestId
    code: ErrorCode = ErrorCode.CANCELLED
    reason: str = "cancelled by the client"
    at: UnixTime = 0.0
