"""Liveness, the vocoder's side: watch the decode owners of in-flight requests.

A request whose decode owner's lease lapsed is normally migrated: the gateway requeues it and a live decode replica
takes it over, publishing a TakeoverMarker that names the new owner (services/decode/migration.py). The vocoder waits
for that up to its migration grace. A request that no live replica took over within the grace, and whose CodesEnd is
not in CODES, will get no more codes: the vocoder ends it with Failed(stage=decode, code=replica_lost) through the
terminal guard, after the audio it already published, and drops its state (if another stage ended it first, the
guard refuses and the state is dropped all the same). A request taken over past the migration limit is ended by the
decode replica that took it over, in-band. (This replica's own lease is the bus's LeaseKeeper; service.py runs it.)
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from messages import DecodeError, decode, subjects
from messages.frames import CodesEnd, CodesMessage
from messages.streams import CODES_STREAM
from services.bus.claims import read_owner
from services.bus.leases import is_alive
from services.bus.logs import request_context
from services.vocoder.request_end import TerminalPublisher
from services.vocoder.request_streams import RequestStream, StreamTable

log = logging.getLogger(__name__)


class OwnerWatch:
    """Checks, on each `check()`, the lease of every in-flight request's decode owner."""

    def __init__(self, js: JetStreamContext, kv: KeyValue, table: StreamTable, terminal: TerminalPublisher, *,
                 migration_grace_s: float = 30.0) -> None:
        self._js, self._kv = js, kv
        self.table = table
        self._terminal = terminal
        self.migration_grace_s = migration_grace_s
        """How long a request whose owner died may wait for a decode replica to take it over."""
        self.num_lost = 0

    async def check(self) -> list[str]:
        """One pass; returns the ids of the requests it ended."""
        by_owner: dict[str, list[RequestStream]] = {}
        for stream in self.table.streams():
            if stream.owner is None:
                claim = await read_owner(self._kv, stream.request_id)
                if claim is None:
                    continue  # not claimed (yet): nothing to judge
                stream.owner = claim.record.replica
            by_owner.setdefault(stream.owner, []).append(stream)
        ended = []
        now = time.monotonic()
        for owner, streams in by_owner.items():
            alive = await is_alive(self._kv, owner)
            for stream in streams:
                with request_context(stream.request_id):
                    if alive:
                        stream.owner_dead_since = None
                        continue
                    if not self._grace_over(stream, owner, now):
                        continue
                    if await self._owner_lost(stream, owner):
                        ended.append(stream.request_id)
        return ended

    def _grace_over(self, stream: RequestStream, owner: str, now: float) -> bool:
        """Whether `stream`'s owner (dead now) has been dead for the whole migration grace."""
        if stream.owner_dead_since is None or stream.owner_dead_owner != owner:
            stream.owner_dead_since, stream.owner_dead_owner = now, owner
            log.warning("decode owner %s of %s is dead; waiting up to %.1fs for a decode replica to take it over",
                        owner, stream.request_id, self.migration_grace_s)
        return now - stream.owner_dead_since >= self.migration_grace_s

    def num_awaiting_migration(self) -> int:
        """Requests whose decode owner is dead, waiting for a decode replica to take them over."""
        return sum(1 for stream in self.table.streams() if stream.owner_dead_since is not None)

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """`check()` every `interval_s` until `stop` is set."""
        while not stop.is_set():
            try:
                await self.check()
            except Exception:  # a bus hiccup must not end the watch; the next pass retries
                log.exception("owner watch pass failed")
            try:
                await asyncio.wait_for(stop.wait(), interval_s)  # the watch period, woken early by stop
            except asyncio.TimeoutError:
                pass

    async def _owner_lost(self, stream: RequestStream, owner: str) -> bool:
        if stream.lock.locked():
            return False  # a message of it is being handled right now: codes still flow; judge next pass
        async with stream.lock:
            if self.table.get(stream.request_id) is not stream:
                return False
            claim = await read_owner(self._kv, stream.request_id)
            if claim is not None and claim.record.replica != owner and await is_alive(self._kv, claim.record.replica):
                log.info("decode owner %s of %s died; %s took over (epoch %d)", owner, stream.request_id,
                         claim.record.replica, claim.record.epoch)
                stream.owner = claim.record.replica
                return False
            if claim is not None and claim.record.replica != owner:
                stream.owner = claim.record.replica  # a newer owner, dead too: its own grace starts now
                return False
            if await self._end_is_stored(stream):
                return False  # decode ended it before dying; the consumer will voice the end
            log.warning("decode owner %s of %s is gone and nobody took it over within %.1fs; failing the request",
                        owner, stream.request_id, self.migration_grace_s)
            event = TerminalPublisher.decode_replica_lost(stream.request_id, owner, frames=stream.frames,
                                                          chunk_count=stream.next_seq)
            await self._terminal.publish(event)
            self.table.release(stream.request_id, ended=True)
            self.num_lost += 1
            return True

    async def _end_is_stored(self, stream: RequestStream) -> bool:
        try:
            last = await self._js.get_last_msg(CODES_STREAM, subjects.codes(stream.partition, stream.request_id))
            message = decode(last.data, CodesMessage)
        except (NotFoundError, DecodeError):
            return False
        return isinstance(message, CodesEnd) and not stream.is_stale(message.epoch)
