"""The terminal-event guard: exactly one terminal event per request, enforced by the server."""

from __future__ import annotations

import logging
import uuid

from nats.js import JetStreamContext

from messages import encode, subjects
from messages.base import InvalidMessage
from messages.events import TerminalEvent
from messages.streams import EVENTS_STREAM
from services.bus.fencing import fenced_publish

log = logging.getLogger(__name__)


async def publish_terminal(js: JetStreamContext, request_id: str, event: TerminalEvent, *,
                           headers: dict[str, str] | None = None) -> bool:
    """Publish `event` on `tts.events.<id>.terminal` with `Nats-Expected-Last-Subject-Sequence: 0`.

    True when this call ended the request; False when another stage already had (the caller stands down).
    """
    if event.request_id != request_id:
        raise InvalidMessage(f"terminal event names request {event.request_id!r}, published for {request_id!r}")
    # Unique per call, so a retry of this call is recognised as ours and another publisher's never is.
    msg_id = f"{request_id}:terminal:{uuid.uuid4().hex}"
    ack = await fenced_publish(js, subjects.terminal(request_id), encode(event), stream=EVENTS_STREAM, expected=0,
                               msg_id=msg_id, headers=headers)
    if ack is None:
        log.info("request %s already has a terminal event; %s stands down", request_id, type(event).__name__)
        return False
    return True
