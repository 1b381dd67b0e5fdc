"""Typed records in the `voxmesh` KV bucket: read, create and compare-and-set update, plus cancellation."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages import DecodeError, decode, encode, subjects
from messages.base import Message
from messages.records import CancelRecord
from services.bus.ack_retry import retrying
from services.bus.errors import OwnershipConflict

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)


@dataclass(frozen=True, slots=True)
class Versioned(Generic[R]):
    """A record and the KV revision it was read or written at (the compare-and-set token)."""

    record: R
    revision: int


async def read_record(kv: KeyValue, key: str, kind: type[R]) -> Versioned[R] | None:
    """The current record under `key`, or None when absent or deleted. DecodeError if it is not a `kind`.

    From the bucket's stream leader when `kv` comes from `open_bucket` (fencing decides on these reads); retried
    through a leader election or a reconnect (`ack_retry`)."""
    try:
        entry = await retrying(lambda: kv.get(key), f"read {key}")
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.revision is None:
        return None
    return Versioned(decode(entry.value, kind), entry.revision)


async def current_records(kv: KeyValue, pattern: str, kind: type[R]) -> list[R]:
    """Every current record whose key matches `pattern` (e.g. "lease.*"), read from the bucket's stream leader;
    unreadable ones are logged and skipped.

    Liveness decisions rest on these lists (a replica whose lease is missing here is judged dead and its work taken
    over), so they must be the leader's state, as `read_record`'s are. A watch (nats-py's `keys()` and `watch()`)
    reads through an ephemeral consumer, which the server places on any current peer of the stream: on a cluster that
    can be a server still catching up after a restart, whose copy lacks the last seconds of lease renewals. So the
    keys come from the stream's info (answered by its leader) and each value from the leader's message get. Transient
    failures (an election, a reconnect) are retried as every read is (`ack_retry`)."""
    js, stream, prefix = _bucket_parts(kv)
    info = await retrying(lambda: js.stream_info(stream, subjects_filter=prefix + pattern), f"list {pattern}")
    found: list[R] = []
    for subject in sorted(info.state.subjects or {}):
        key = subject[len(prefix):]
        try:
            current = await read_record(kv, key, kind)
        except DecodeError as exc:
            log.error("skipping unreadable %s: %s", key, exc)
            continue
        if current is not None:
            found.append(current.record)
    return found


def _bucket_parts(kv: KeyValue) -> tuple[JetStreamContext, str, str]:
    """The bucket's JetStream context, stream and subject prefix (`$KV.<bucket>.`): nats-py (pinned) keeps them as
    the handle's attributes and offers no listing that is not a watch."""
    return kv._js, kv._stream, kv._pre  # noqa: SLF001 - see the docstring


async def write_record(kv: KeyValue, key: str, record: R, *, expected: Versioned | None) -> Versioned[R]:
    """Compare-and-set: create when `expected` is None, else update only if the key is still at its revision.

    A write that meets a leader election or a reconnect is retried (`ack_retry`); if an earlier attempt had landed
    (its ack lost), the retry is refused as a conflict, and the key's value, read from the leader, shows the write
    was ours (a record carries its writer and time, so no other writer's value is equal). Raises OwnershipConflict
    when someone else wrote the key first.
    """
    data = encode(record)

    async def write_once() -> int:
        if expected is None:
            return await kv.create(key, data)
        return await kv.update(key, data, last=expected.revision)

    try:
        return Versioned(record, await retrying(write_once, f"write {key}"))
    except KeyWrongLastSequenceError as exc:
        landed = await _revision_if_ours(kv, key, data)
        if landed is not None:
            return Versioned(record, landed)
        raise OwnershipConflict(f"{key} changed under us (expected revision "
                                f"{expected.revision if expected else 'none'}): another writer won") from exc


async def _revision_if_ours(kv: KeyValue, key: str, data: bytes) -> int | None:
    try:
        entry = await retrying(lambda: kv.get(key), f"read {key}")
    except KeyNotFoundError:
        return None
    return entry.revision if entry.value == data else None


async def cancel_request(kv: KeyValue, record: CancelRecord) -> None:
    """Mark a request cancelled (the gateway); every stage checks `is_cancelled` and stops work for it."""
    await kv.put(subjects.cancel_key(record.request_id), encode(record))


async def read_cancel(kv: KeyValue, request_id: str) -> CancelRecord | None:
    """The request's CancelRecord, or None when it is not cancelled."""
    found = await read_record(kv, subjects.cancel_key(request_id), CancelRecord)
    return found.record if found is not None else None
