"""Where a request's prompt is prefilled: on a prefill replica (remote prefill) or on decode itself.

Remote prefill pays for itself only on long prompts, and only when a prefill replica is free: a prompt queued behind
others at prefill waits longer than decode would take to prefill it beside its running batch. So a request goes to
the prefill queue when its text is at least `min_chars` long, a prefill replica is alive (its lease is live: a killed
or stalled one drops out within the lease's time to live), and fewer than `max_queue` prompts per live replica are
already waiting there or being prefilled (counting those routed since the queue was last looked at); otherwise it
goes to decode's queue. The leases and the queue are read at most every `refresh_s`, so routing costs no round trip
on most requests.
"""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from messages import subjects
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM, prefill_consumer
from services.bus.leases import live_replicas

log = logging.getLogger(__name__)


class PrefillRoute:
    """Chooses each request's subject on REQUESTS."""

    def __init__(self, js: JetStreamContext, kv: KeyValue, model: str, min_chars: int, max_queue: int = 2,
                 refresh_s: float = 0.2) -> None:
        self.js, self.kv, self.model = js, kv, model
        self.min_chars, self.max_queue, self.refresh_s = min_chars, max_queue, refresh_s
        self._looked_at = -float("inf")
        self._looking = asyncio.Lock()
        self._room = 0
        """Prompts the prefill replicas may still take before the next look."""
        self.num_remote = 0

    @property
    def is_on(self) -> bool:
        return self.min_chars > 0

    async def subject_for(self, request: SynthesisRequest) -> str:
        """The subject `request` is published on."""
        local = subjects.request_for(request.model, request.priority, request.tenant)
        if not self.is_on or len(request.text) < self.min_chars:
            return local
        await self._refresh()
        if self._room <= 0:
            return local
        self._room -= 1
        self.num_remote += 1
        return subjects.prefill_request(request.model)

    async def _refresh(self) -> None:
        async with self._looking:  # requests arriving during a look wait for its answer, not the stale one
            if time.monotonic() - self._looked_at >= self.refresh_s:
                await self._look()
                self._looked_at = time.monotonic()

    async def _look(self) -> None:
        try:
            replicas = await live_replicas(self.kv, "prefill")
            if not replicas:
                self._room = 0
                return
            info = await self.js.consumer_info(REQUESTS_STREAM, prefill_consumer(self.model), timeout=1.0)
        except NotFoundError:
            self._room = 0  # not provisioned for remote prefill: decode prefills every prompt
            return
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("could not read the prefill replicas' state (%s); prefilling on decode meanwhile", exc)
            self._room = 0
            return
        queued = (info.num_pending or 0) + (info.num_ack_pending or 0)
        self._room = self.max_queue * len(replicas) - queued
