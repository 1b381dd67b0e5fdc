"""The gateway's door for a tenant's requests: its limits on the way in (services/gateway/tenancy/shared_limits.py),
its seat given back on the way out, its audio charged when the request's `finished` event arrives (on the
gateway's terminal feed, so a request whose client left is charged too), and its metrics by key class."""

from __future__ import annotations

import asyncio
import logging

from messages.events import Finished, TerminalEvent
from services.gateway.tenancy.key_metrics import KeyClassMetrics
from services.gateway.tenancy.refusals import LimitRefused
from services.gateway.tenancy.shared_limits import Admission, SharedLimits
from services.gateway.tenancy.tenant import Tenant

log = logging.getLogger(__name__)


class TenantGate:
    """Admits a tenant's calls (one per gateway); `on_terminal` listens to the gateway's terminal feed."""

    def __init__(self, limits: SharedLimits, metrics: KeyClassMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self._charging: dict[str, Tenant] = {}  # request id -> tenant, until its terminal event
        self._tasks: set[asyncio.Task] = set()

    async def admit(self, tenant: Tenant) -> Admission:
        """One admission of `tenant` (give it back with `release`). Raises LimitRefused."""
        try:
            admission = await self.limits.admit(tenant)
        except LimitRefused as refusal:
            self.metrics.refused(tenant.key_class, refusal.code.value)
            raise
        self.metrics.admitted(tenant.key_class)
        return admission

    async def release(self, admission: Admission) -> None:
        """The admitted call's request is no longer live here (shielded: a cancelled caller still gives it back)."""
        self.metrics.released(admission.tenant.key_class)
        await asyncio.shield(self.limits.release(admission))

    def charge_when_ended(self, request_id: str, tenant: Tenant) -> None:
        """Charge `request_id`'s audio to `tenant` when its `finished` event arrives."""
        self._charging[request_id] = tenant

    def on_terminal(self, event: TerminalEvent) -> None:
        tenant = self._charging.pop(event.request_id, None)
        if tenant is None or not isinstance(event, Finished) or event.audio_seconds <= 0:
            return
        self.metrics.charged(tenant.key_class, event.audio_seconds)
        task = asyncio.get_running_loop().create_task(self._charge(tenant, event.audio_seconds))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _charge(self, tenant: Tenant, seconds: float) -> None:
        try:
            await self.limits.charge_audio(tenant, seconds)
        except Exception as exc:  # the day's total misses this request: said, not retried forever
            log.error("could not charge %.1f s of audio to a key's daily total: %r", seconds, exc)

    async def close(self) -> None:
        """Let the charges under way finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
