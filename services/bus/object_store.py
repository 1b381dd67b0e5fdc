"""Large values on the bus (reference audio, saved voices): thin, typed access to a JetStream object store.

nats-py's object store answers "empty" by raising on `list()`, and its `get()` waits on the chunks with no bound;
these helpers give `None`/`[]` for absent objects and put a time limit on every read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from services.bus.errors import NotProvisioned

READ_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class StoredObject:
    """What an object store says about one object."""

    name: str
    revision: str
    """The object's id: a new one each time the name is written."""
    size: int
    modified: str | None
    """ISO 8601 time of the write, as the writer recorded it."""
    description: str | None


async def open_object_store(js: JetStreamContext, name: str) -> ObjectStore:
    """Bind to a provisioned object store; NotProvisioned if it does not exist."""
    try:
        return await js.object_store(name)
    except BucketNotFoundError as exc:
        raise NotProvisioned(f"object store {name!r} does not exist: run `voxmesh provision` or `voxmesh up`") from exc


def _stored(info: api.ObjectInfo) -> StoredObject:
    return StoredObject(info.name, info.nuid, info.size or 0, info.mtime, info.description)


async def object_info(store: ObjectStore, name: str) -> StoredObject | None:
    """The object's current description, or None when there is none (never written, deleted or expired)."""
    try:
        return _stored(await asyncio.wait_for(store.get_info(name), READ_TIMEOUT_S))
    except NotFoundError:
        return None


async def read_object(store: ObjectStore, name: str) -> tuple[StoredObject, bytes] | None:
    """The object and its bytes, or None when there is none. Raises TimeoutError past READ_TIMEOUT_S."""
    try:
        result = await asyncio.wait_for(store.get(name), READ_TIMEOUT_S)
    except NotFoundError:
        return None
    return _stored(result.info), bytes(result.data)


async def write_object(store: ObjectStore, name: str, data: bytes, description: str | None = None) -> StoredObject:
    """Write (or replace) an object; returns its description with the new revision."""
    return _stored(await store.put(name, data, meta=api.ObjectMeta(name=name, description=description)))


async def delete_object(store: ObjectStore, name: str) -> bool:
    """Delete an object; False when there was none."""
    try:
        await store.delete(name)
    except NotFoundError:
        return False
    return True


async def list_objects(store: ObjectStore, prefix: str = "") -> list[StoredObject]:
    """The live objects whose names start with `prefix`, by name."""
    try:
        infos = await asyncio.wait_for(store.list(ignore_deletes=True), READ_TIMEOUT_S)
    except NotFoundError:  # nats-py's way of saying the store is empty
        return []
    return sorted((_stored(i) for i in infos if not i.deleted and i.name.startswith(prefix)), key=lambda o: o.name)
