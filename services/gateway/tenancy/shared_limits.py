"""Each key's limits, held across every gateway of a mesh and across restarts: state in the `voxmesh-limits` KV
bucket (messages/key_limits.py), changed only by compare-and-set (`update(..., last=revision)`), so two gateways that
admit at the same instant cannot both spend the same token or seat: the loser reads again and decides again.

Consistency model (what can overshoot, and by how much):
- Requests per second: exact up to the gateways' clocks. Each refill is computed from the writer's wall clock; a
  gateway whose clock runs ahead of the stored time refills early by that skew (at most `skew x rate` tokens
  once), one behind refills nothing until it catches up. With NTP (skew of milliseconds) the error is below one
  token.
- Live requests: exact among live gateways. A key's seats are counted per gateway replica (`seats.<key>`); each
  gateway writes its own count from its own books, so a lost write is corrected by its next one. A gateway that dies
  holding seats keeps them until its lease lapses (`lease.<replica>`, a few seconds), then the next admission drops
  them. A restarted gateway is a new replica: its predecessor's requests may still be streaming through another
  gateway (resumed) without a seat, so right after a crash a key can briefly hold up to that many more.
- Audio seconds per UTC day: charged when a request ends, by the gateway that admitted it, from its `finished`
  event's audio seconds; a new request is refused once the day's total is at the quota. Requests already running
  when the quota is reached finish, so a day can overshoot by at most what the key's live requests make after that
  (at most `live_requests x` the longest request's audio). A request whose admitting gateway died before its end is
  not charged.
A compare-and-set that keeps losing (more than `MAX_ATTEMPTS` writers racing on one key) refuses the call as
rate-limited rather than admit it unchecked.
"""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from messages import encode
from messages.base import Message
from messages.errors import ErrorCode
from messages.key_limits import AudioDay, RateState, SeatsState, audio_key, rate_key, seats_key
from services.bus.kvstore import Versioned, read_record
from services.bus.leases import is_alive
from services.gateway.tenancy.refusals import LimitRefused, RateHeaders
from services.gateway.tenancy.tenant import Tenant
from services.gateway.tenancy.token_bucket import BucketState, take_one

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)
T = TypeVar("T")

MAX_ATTEMPTS = 16
LEASE_MEMO_S = 1.0  # another gateway's liveness is read at most this often


@dataclass(frozen=True, slots=True)
class Admission:
    """A call admitted under its key's limits: release it when its request is no longer live.

    Attributes:
        tenant: whose call it is.
        rate: the key's rate-limit headers after this call (None: no rate limit).
        seated: it holds one of the key's live seats (release gives it back).
    """

    tenant: Tenant
    rate: RateHeaders | None
    seated: bool


class SharedLimits:
    """Admits calls under their key's limits and charges their audio; one per gateway."""

    def __init__(self, limits_kv: KeyValue, leases_kv: KeyValue, replica: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._kv = limits_kv
        self._leases = leases_kv
        self._replica = replica
        self._clock = clock
        self._held: dict[str, int] = {}  # this gateway's own seats per limit key: the truth it writes
        self._alive: dict[str, tuple[float, bool]] = {}
        self._lock = asyncio.Lock()  # one seat write at a time from this gateway keeps its own count in order

    async def admit(self, tenant: Tenant) -> Admission:
        """Check the day's audio, take a token, take a seat. Raises LimitRefused (nothing is held then)."""
        limits = tenant.limits
        if limits.audio_s_per_day is not None:
            await self._check_quota(tenant, limits.audio_s_per_day)
        rate = await self._take_token(tenant) if limits.requests_per_s is not None else None
        if limits.live_requests is not None:
            await self._take_seat(tenant, limits.live_requests, rate)
        return Admission(tenant, rate, limits.live_requests is not None)

    async def release(self, admission: Admission) -> None:
        """The admitted call's request is no longer live here: give its seat back (a failure is logged; this
        gateway's next write of the key's seats corrects it)."""
        if not admission.seated:
            return
        key = admission.tenant.limit_key
        async with self._lock:
            self._held[key] = max(0, self._held.get(key, 0) - 1)
            try:
                await self._cas(seats_key(key), SeatsState, lambda found: (self._with_own(found, key), None))
            except Exception as exc:  # the bus is away: the seat is written back with the next change
                log.warning("could not give back a live seat of a key (%r); written with its next change", exc)

    async def charge_audio(self, tenant: Tenant, seconds: float, at: float | None = None) -> None:
        """Add `seconds` of audio to the key's total of the UTC day of `at` (now)."""
        if tenant.limits.audio_s_per_day is None or seconds <= 0:
            return
        key = audio_key(tenant.limit_key, self._clock() if at is None else at)

        def add(found: AudioDay | None) -> tuple[AudioDay, None]:
            return AudioDay(seconds=(found.seconds if found is not None else 0.0) + seconds), None

        await self._cas(key, AudioDay, add)

    async def audio_today(self, tenant: Tenant) -> float:
        """The key's audio seconds of this UTC day so far."""
        found = await read_record(self._kv, audio_key(tenant.limit_key, self._clock()), AudioDay)
        return found.record.seconds if found is not None else 0.0

    async def _check_quota(self, tenant: Tenant, quota: float) -> None:
        used = await self.audio_today(tenant)
        if used >= quota:
            now = self._clock()
            midnight = calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0)) + 86400
            raise LimitRefused(ErrorCode.QUOTA_EXCEEDED, f"this API key's audio of the day is spent ({used:.0f} of "
                               f"{quota:.0f} s); it renews at 00:00 UTC", midnight - now, None)

    async def _take_token(self, tenant: Tenant) -> RateHeaders:
        rate, size = tenant.limits.requests_per_s or 0.0, tenant.limits.bucket_size or 0.0  # set: admit checked

        def take(found: RateState | None):
            state = BucketState(found.tokens, found.at) if found is not None else None
            outcome = take_one(state, rate, size, self._clock())
            new = RateState(tokens=outcome.state.tokens, at=outcome.state.at) if outcome.admitted else None
            return new, outcome

        outcome = await self._cas(rate_key(tenant.limit_key), RateState, take)
        headers = RateHeaders(int(size), outcome.remaining, outcome.reset_s)
        if not outcome.admitted:
            raise LimitRefused(ErrorCode.RATE_LIMITED, f"this API key's request rate is spent ({rate:g}/s, bursts "
                               f"of {size:g}); retry in {outcome.retry_after_s:.2f}s", outcome.retry_after_s, headers)
        return headers

    async def _take_seat(self, tenant: Tenant, limit: int, rate: RateHeaders | None) -> None:
        key = tenant.limit_key
        async with self._lock:
            dead = await self._dead_holders(key)
            own = self._held.get(key, 0)

            def seat(found: SeatsState | None):
                # Holders not judged dead count, new ones included (conservative); this gateway's own from its books.
                counted = {r: n for r, n in (found.held if found is not None else {}).items()
                           if r not in dead and r != self._replica and n > 0}
                if sum(counted.values()) + own + 1 > limit:
                    return None, False
                return SeatsState(held={**counted, self._replica: own + 1}), True

            if not await self._cas(seats_key(key), SeatsState, seat):
                raise LimitRefused(ErrorCode.TOO_MANY_LIVE_REQUESTS, f"this API key has {limit} requests live at "
                                   "once (its limit, across every gateway); retry when one ends", 1, rate)
            self._held[key] = own + 1

    async def _dead_holders(self, key: str) -> set[str]:
        """Other gateways that hold seats of the key in the bus's record but whose lease has lapsed."""
        found = await read_record(self._kv, seats_key(key), SeatsState)
        held = found.record.held if found is not None else {}
        return {replica for replica in held if replica != self._replica and not await self._is_alive(replica)}

    async def _is_alive(self, replica: str) -> bool:
        now = time.monotonic()
        memo = self._alive.get(replica)
        if memo is not None and now - memo[0] < LEASE_MEMO_S:
            return memo[1]
        alive = await is_alive(self._leases, replica)
        self._alive[replica] = (now, alive)
        return alive

    def _with_own(self, found: SeatsState | None, key: str) -> SeatsState:
        held = dict(found.held) if found is not None else {}
        held.pop(self._replica, None)
        if self._held.get(key, 0) > 0:
            held[self._replica] = self._held[key]
        return SeatsState(held=held)

    async def _cas(self, key: str, kind: type[R], change: Callable[[R | None], tuple[R | None, T]]) -> T:
        """Read `key`, let `change` decide (a new value, or None to write nothing) and write it only if nobody
        wrote in between; otherwise read and decide again."""
        for _ in range(MAX_ATTEMPTS):
            found: Versioned[R] | None = await read_record(self._kv, key, kind)
            new, result = change(found.record if found is not None else None)
            if new is None:
                return result
            try:
                if found is None:
                    await self._kv.create(key, encode(new))
                else:
                    await self._kv.update(key, encode(new), last=found.revision)
                return result
            except KeyWrongLastSequenceError:
                continue
        raise LimitRefused(ErrorCode.RATE_LIMITED, "too many gateways are admitting this API key's requests at "
                           "once; retry shortly", 1, None)
