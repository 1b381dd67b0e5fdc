"""Appending to CODES through a bus blip: a failed append is retried with backoff, a bounded number of times.

A retry repeats the same message with the same `Nats-Msg-Id` and the same expected last sequence, so an attempt
that did land but lost its ack is recognised (`fenced_publish`) and never appended twice. A fenced-out owner
(`StaleOwner`) is never retried: another owner has the request.
"""

from __future__ import annotations

import asyncio
import logging
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
    """Waits of at most 0.1, 0.2, 0.4 and 0.8 s: a blip of a couple of seconds is ridden out (each attempt also
    retries a lost ack itself), a bus that stays away fails the request within seconds."""


async def append_retrying(publisher: CodesPublisher, message: CodesChunk | CodesEnd, retry: PublishRetry) -> int:
    """Append `message`; returns its stream sequence. Raises StaleOwner at once, a bus error after every attempt."""
    for attempt in range(retry.attempts):
        try:
            return await publisher.publish(message)
        except TRANSIENT_BUS_ERRORS as exc:
            if attempt + 1 == retry.attempts:
                raise
            delay = retry.backoff.delay(attempt)
            log.warning("request %s: appending %s failed (%r); retrying in %.2fs", message.request_id,
                        type(message).__name__, exc, delay)
            await asyncio.sleep(delay)  # a backoff, not a synchronisation: nothing signals the bus's return
    raise AssertionError("unreachable: the loop returns or raises")
