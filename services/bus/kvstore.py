"""Typed records in the `voxmesh` KV bucket: read, create and compare-and-set update, plus cancellation."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
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


ONE_READ_CONSUMER_IDLE_S = 2.0
"""How long the server keeps a `current_records` read's consumer once the read has stopped listening. nats-py's
default is 5 minutes, and the server holds at most 1,000 consumers a stream: control loops and readiness probes that
read every second (`voxmesh up` polls the gateway's /ready 4 times a second while the codec warms up) would fill the
bucket's stream within minutes, and every later read would fail with `maximum consumers limit reached`."""


async def current_records(kv: KeyValue, pattern: str, kind: type[R], *, timeout_s: float = 5.0) -> list[R]:
    """Every current record whose key matches `pattern` (e.g. "lease.*"); unreadable ones are logged and skipped.

    Raises nats' TimeoutError when the values stop coming for `timeout_s` (the connection went away mid-read): a
    control loop reading this every tick must not hang on a watcher whose end marker never comes."""
    watcher = await kv.watch(pattern, ignore_deletes=True, inactive_threshold=ONE_READ_CONSUMER_IDLE_S)
    found: list[R] = []
    try:
        while True:
            entry = await watcher.updates(timeout=timeout_s)
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
