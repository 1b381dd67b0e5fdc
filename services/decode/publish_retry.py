"""Appending to CODES through a bus blip: a failed append is retried with backoff, a bounded number of times.

Two layers, each with its own errors, so that their bounds do not multiply. `fenced_publish` itself rides out what a
leader election or a reconnect answers (`ack_retry.is_transient`: no ack, no responders, 503) for up to
`AckRetry.total_s`; once it gives up, the bus has stayed away that long and the request fails. What is left to this
layer are the other errors a bus blip raises (a JetStream API error such as a store momentarily full, a connection
closed under the call), retried here a few times within seconds. A retry repeats the same message with the same
`Nats-Msg-Id` and the same expected last sequence, so an attempt that did land but lost its ack is recognised
(`fenced_publish`) and never appended twice. A fenced-out owner (`StaleOwner`) is never retried: another owner has
the request.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from messages.frames import CodesChunk, CodesEnd
from services.bus.ack_retry import is_transient
from services.bus.codes_publisher import CodesPublisher
from services.bus.connection import Backoff
from services.bus.leases import TRANSIENT_BUS_ERRORS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishRetry:
    """How often and how patiently one codes message is appended before the request is given up."""

    attempts: int = 5
    backoff: Backoff = Backoff(base_s=0.1, max_s=1.0)
    """Waits of at most 0.1, 0.2, 0.4 and 0.8 s between attempts that met an error `fenced_publish` does not retry
    itself; one that its own retry gave up on (`is_transient`) is raised at once: the bus has been away for its whole
    bound already, and retrying it here would multiply that bound by `attempts`."""


async def append_retrying(publisher: CodesPublisher, message: CodesChunk | CodesEnd, retry: PublishRetry) -> int:
    """Append `message`; returns its stream sequence. Raises StaleOwner at once, an error that `fenced_publish` has
    already retried for its whole bound at once, any other bus error after every attempt."""
    for attempt in range(retry.attempts):
        try:
            return await publisher.publish(message)
        except TRANSIENT_BUS_ERRORS as exc:
            if is_transient(exc) or attempt + 1 == retry.attempts:
                raise
            delay = retry.backoff.delay(attempt)
            log.warning("request %s: appending %s failed (%r); retrying in %.2fs", message.request_id,
                        type(message).__name__, exc, delay)
            await asyncio.sleep(delay)  # a backoff, not a synchronisation: nothing signals the bus's return
    raise AssertionError("unreachable: the loop returns or raises")
