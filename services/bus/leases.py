"""Liveness: each replica renews `lease.<replica>` every second; a lease older than its ttl means a dead replica."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from messages import encode, subjects
from messages.errors import InvalidConfig
from messages.records import Lease
from services.bus.connection import Backoff
from services.bus.kvstore import current_records, read_record
from services.bus.stoppable import unless_stopped

log = logging.getLogger(__name__)

TRANSIENT_BUS_ERRORS = (nats.errors.Error, asyncio.TimeoutError)
"""What a renewal may meet while the bus blips (nats' timeouts, reconnects, no responders, JetStream API errors such
as a full store): retried, never fatal."""


class LeaseKeeper:
    """Renews one replica's lease until stopped; on a clean stop deletes it so others see the exit at once."""

    def __init__(self, kv: KeyValue, replica: str, service: str, *, interval_s: float = 1.0,
                 ttl_s: float = 3.0) -> None:
        if not 0 < interval_s < ttl_s:
            raise InvalidConfig(f"lease interval_s ({interval_s}) must be > 0 and below ttl_s ({ttl_s})")
        self._kv = kv
        self.key = subjects.lease_key(replica)
        self.replica = replica
        self.service = service
        self.interval_s = interval_s
        self.ttl_s = ttl_s

    async def renew(self) -> int:
        """Write a fresh lease now; returns the KV revision."""
        lease = Lease(replica=self.replica, service=self.service, renewed_at=time.time(), ttl_s=self.ttl_s)
        return await self._kv.put(self.key, encode(lease))

    async def run(self, stop: asyncio.Event) -> None:
        """Renew every interval until `stop` is set, then delete the lease.

        A renewal that fails on the bus (a timeout, a reconnect, a full store) never ends the replica: it is retried
        with backoff (never sparser than the interval) for as long as the process lives. Only renewals failing past
        the ttl lose the lease, and then the cluster rightly judges this replica dead."""
        streak = RenewalStreak(self)
        while not stop.is_set():
            try:
                if await unless_stopped(self.renew(), stop) is None:
                    break  # stopped while the renewal waited on the bus: the exit is what matters now
            except TRANSIENT_BUS_ERRORS as exc:
                delay = streak.failed(exc)
            else:
                streak.renewed()
                delay = self.interval_s
            try:
                await asyncio.wait_for(stop.wait(), delay)  # the renewal period, woken early by stop
            except asyncio.TimeoutError:
                pass
        try:
            # No longer than the ttl: by then the lease has lapsed anyway (a bus that does not answer, say).
            await asyncio.wait_for(self._kv.delete(self.key), self.ttl_s)
        except KeyNotFoundError:
            pass
        except TRANSIENT_BUS_ERRORS as exc:  # the lease then lapses by its ttl: others see the exit a little later
            log.warning("lease %s not deleted at exit (%r); it lapses within %.1fs", self.key, exc, self.ttl_s)
            return
        log.info("lease %s released", self.key)


class RenewalStreak:
    """A run of failed renewals: its backoff, and its log lines (one when it starts, one if the lease lapses, one
    when a renewal succeeds again)."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper
        self._backoff = Backoff(base_s=min(0.1, keeper.interval_s), max_s=keeper.interval_s)
        self.failures = 0
        self.since: float | None = None
        self._lapsed = False

    def failed(self, exc: BaseException) -> float:
        """Count a failure; returns the seconds to wait before the next attempt."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("lease %s: renewal failed (%r); retrying with backoff", self._keeper.key, exc)
        elif not self._lapsed and now - self.since > self._keeper.ttl_s:
            self._lapsed = True
            log.error("lease %s: renewals have failed for %.1fs, past the %.1fs ttl: the mesh now judges this replica "
                      "dead and may take its work over; still retrying (last error %r)", self._keeper.key,
                      now - self.since, self._keeper.ttl_s, exc)
        self.failures += 1
        return self._backoff.delay(self.failures - 1)

    def renewed(self) -> None:
        if self.since is not None:
            log.info("lease %s renewed again after %d failed attempt(s) over %.1fs", self._keeper.key, self.failures,
                     time.monotonic() - self.since)
        self.failures, self.since, self._lapsed = 0, None, False


async def read_lease(kv: KeyValue, replica: str) -> Lease | None:
    """The replica's last lease, or None if it never had one or left cleanly."""
    found = await read_record(kv, subjects.lease_key(replica), Lease)
    return found.record if found is not None else None


def lease_expired(lease: Lease | None, now: float | None = None) -> bool:
    """True when there is no lease or it was last renewed more than its ttl ago (clocks of one host or NTP)."""
    if lease is None:
        return True
    return (time.time() if now is None else now) - lease.renewed_at > lease.ttl_s


async def is_alive(kv: KeyValue, replica: str, now: float | None = None) -> bool:
    """Whether `replica` holds a live lease."""
    return not lease_expired(await read_lease(kv, replica), now)


async def live_leases(kv: KeyValue, now: float | None = None) -> list[Lease]:
    """Every replica's lease that is live now, of any service."""
    now = time.time() if now is None else now
    return [lease for lease in await current_records(kv, subjects.all_lease_keys(), Lease)
            if not lease_expired(lease, now)]


async def live_replicas(kv: KeyValue, service: str, now: float | None = None) -> list[str]:
    """Replicas of `service` whose lease is live, sorted by name."""
    return sorted(lease.replica for lease in await live_leases(kv, now) if lease.service == service)
