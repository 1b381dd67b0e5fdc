"""Follows every replica's lease in the bucket (a KV watch: puts and deletes as they happen) into a ReplicaSet, so
the client knows the live mtp replicas without asking before each step. A replica killed outright writes nothing:
its lease just ages past its ttl, which `ReplicaSet` judges at each choice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.js.kv import KeyValue

from messages import DecodeError, decode, subjects
from messages.records import Lease
from services.mtp.replica_set import ReplicaSet

log = logging.getLogger(__name__)

_DELETES = ("DEL", "PURGE")


class LeaseFollower:
    """An owned task applying lease changes to `replicas`; `wait_until` wakes on each change."""

    def __init__(self, kv: KeyValue, replicas: ReplicaSet) -> None:
        self._kv = kv
        self._replicas = replicas
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self._watcher = None

    async def start(self) -> None:
        """Start following; returns once the current leases are known."""
        self._watcher = await self._kv.watch(subjects.all_lease_keys())
        synced = asyncio.Event()
        self._task = asyncio.create_task(self._follow(synced), name="mtp-lease-follower")
        await synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._watcher is not None:
            await self._watcher.stop()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(condition)

    async def _follow(self, synced: asyncio.Event) -> None:
        try:
            await self._apply_updates(synced)
        except Exception:  # noqa: BLE001 - said once, loudly: the leases known so far age out, steps then fail typed
            log.exception("mtp lease follower stopped; no replica joins until the client is restarted")

    async def _apply_updates(self, synced: asyncio.Event) -> None:
        async for entry in self._watcher:
            if entry is None:  # the watcher's marker: every current lease has been delivered
                synced.set()
                continue
            if entry.operation in _DELETES or not entry.value:
                self._replicas.lease_deleted(entry.key)
            else:
                try:
                    self._replicas.leased(decode(entry.value, Lease))
                except DecodeError as bad:
                    log.error("skipping unreadable lease %s: %s", entry.key, bad)
            async with self._changed:
                self._changed.notify_all()
