"""Appending to CODES through a bus blip: a failed append is retried with backoff, within a number of attempts and
a total time.

Two layers. `fenced_publish` itself rides out what a leader election or a reconnect answers (`ack_retry`: no ack, no
responders, 503) within its own bounds (`AckRetry`: three lost acks, or 30 s); this layer appends again when that
gives up, or when the bus raised something else (a JetStream API error such as a store momentarily full, a connection
closed under the call). A new attempt starts only within `PublishRetry.total_s` of the first, so the two bounds add
(at most `total_s` plus one attempt) instead of multiplying (`attempts` times the inner bound: minutes on a bus that
stays away, while the request holds a seat and its client has long been told the bus is gone). A retry repeats the
same message with the same `Nats-Msg-Id` and the same expected last sequence, so an attempt that did land but lost
its ack is recognised (`fenced_publish`) and never appended twice. A fenced-out owner (`StaleOwner`) is never
retried: another owner has the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from messages.frames import CodesChunk, CodesEnd
from services.bus.codes_publisher import CodesPublisher
from services.bus.connection import Backoff
from services.bus.leases import TRANSIENT_BUS_ERRORS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishRetry:
    """How often and how patiently one codes message is appended before the request is given up."""

    attempts: int = 5
    backoff: Backoff = Backoff(base_s=0.1, max_s=1.0)
    """Waits of at most 0.1, 0.2, 0.4 and 0.8 s: a blip of a couple of seconds is ridden out."""
    total_s: float = 20.0
    """No attempt starts later than this after the first: with one attempt's own bound (30 s when no leader
    answers), a bus that stays away fails the request within about 50 s."""


async def append_retrying(publisher: CodesPublisher, message: CodesChunk | CodesEnd, retry: PublishRetry,
                          clock: Callable[[], float] = time.monotonic) -> int:
    """Append `message`; returns its stream sequence. Raises StaleOwner at once, a bus error once the attempts or
    the total time (on `clock`) are spent."""
    deadline = clock() + retry.total_s
    for attempt in range(retry.attempts):
        try:
            return await publisher.publish(message)
        except TRANSIENT_BUS_ERRORS as exc:
            delay = retry.backoff.delay(attempt)
            if attempt + 1 == retry.attempts or clock() + delay > deadline:
                raise
            log.warning("request %s: appending %s failed (%r); retrying in %.2fs", message.request_id,
                        type(message).__name__, exc, delay)
            await asyncio.sleep(delay)  # a backoff, not a synchronisation: nothing signals the bus's return
    raise AssertionError("unreachable: the loop returns or raises")
