"""Cancellation: the gateway writes `cancel.<id>`; decode aborts the request and ends it with CodesEnd failed.

The CodesEnd carries the record's code (`cancelled` for a client cancel, `timeout` for a lapsed resume window)
attributed to the gateway stage. A cancel written while the request still waited on REQUESTS is caught by the intake,
which reads the key before starting the request.
"""

from __future__ import annotations

import asyncio
import logging

from messages import DecodeError, decode, subjects
from messages.base import ErrorInfo
from messages.errors import Stage
from messages.records import CancelRecord
from services.bus.logs import request_context
from services.decode.core import DecodeCore, Ending

log = logging.getLogger(__name__)


class CancelWatcher:
    """Watches `cancel.*` in the bucket and cancels the requests this replica owns."""

    def __init__(self, core: DecodeCore) -> None:
        self.core = core
        self.num_cancelled = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set."""
        watcher = await self.core.kv.watch(subjects.all_cancel_keys(), ignore_deletes=True)
        stopping = asyncio.create_task(self._stop_on(stop, watcher))
        try:
            async for entry in watcher:
                if entry is None or entry.value is None:
                    continue  # the "caught up" marker, or a tombstone
                await self._on_record(entry.key, entry.value)
        finally:
            stopping.cancel()

    @staticmethod
    async def _stop_on(stop: asyncio.Event, watcher) -> None:
        await stop.wait()
        await watcher.stop()  # ends the `async for` above

    async def _on_record(self, key: str, value: bytes) -> None:
        try:
            record = decode(value, CancelRecord)
        except DecodeError as exc:
            log.error("ignoring undecodable %s: %s", key, exc)
            return
        if record.request_id in self.core.active:
            with request_context(record.request_id):
                await self.cancel(record)

    async def cancel(self, record: CancelRecord) -> bool:
        """Abort the request in the engine (its KV blocks are free on return) and end it. False if not active."""
        core = self.core
        active = core.active.get(record.request_id)
        if active is None:
            return False
        await core.worker.run(core.engine.abort_request, record.request_id)
        error = ErrorInfo(code=record.code, stage=Stage.GATEWAY, message=record.reason)
        ended = await core.end(active, Ending(error=error))
        if ended:
            self.num_cancelled += 1
            log.info("request %s cancelled (%s)", record.request_id, record.code.value)
        return ended
