"""Every request's terminal event as EVENTS stores it, read by one JetStream consumer per gateway.

A core subscription to `tts.events.<id>.terminal` is not enough: a second terminal that the stream refuses (the
guard's expected-last-subject-sequence) still reaches core subscribers, and a terminal published while the connection
is down is lost to them. The feed reads the stream instead, through an ordered consumer filtered to terminal subjects:
only what the stream accepted arrives, in order, and after a reconnect (or a server restart) the consumer is
re-created from the last stream sequence it saw, so a terminal published meanwhile still arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from messages import DecodeError, decode, subjects
from messages.events import TerminalEvent
from messages.streams import EVENTS_STREAM

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""Idle heartbeat of the consumer: a consumer lost with a restarted server is noticed (and re-created from the
last sequence seen) after two missed heartbeats."""

TerminalCallback = Callable[[TerminalEvent], None]


class TerminalFeed:
    """Dispatches each terminal event the stream accepted to the request that waits for it, and to every listener.

    `follow` starts the consumer on first use (before the request is published, so nothing can be missed);
    `close` stops it."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._followers: dict[str, TerminalCallback] = {}
        self._listeners: list[TerminalCallback] = []
        self._subscription = None
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        """Create the consumer unless it runs (idempotent). Terminals stored before it started are not replayed."""
        async with self._starting:
            if self._subscription is None:
                self._subscription = await self._js.subscribe(
                    subjects.all_terminals(), stream=EVENTS_STREAM, ordered_consumer=True,
                    deliver_policy=DeliverPolicy.NEW, idle_heartbeat=HEARTBEAT_S, cb=self._on_message)

    async def close(self) -> None:
        """Stop reading (idempotent)."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            try:
                await subscription.unsubscribe()
            except Exception as exc:  # a closed or draining connection: nothing left to release
                log.debug("terminal feed: unsubscribe failed: %r", exc)

    async def follow(self, request_id: str, on_terminal: TerminalCallback) -> None:
        """Call `on_terminal` with the request's terminal event when the stream stores it."""
        self._followers[request_id] = on_terminal
        await self.start()

    def unfollow(self, request_id: str) -> None:
        self._followers.pop(request_id, None)

    def listen(self, on_terminal: TerminalCallback) -> None:
        """Call `on_terminal` for every request's terminal event (the supervisor stops watching ended requests)."""
        self._listeners.append(on_terminal)

    async def _on_message(self, msg: Msg) -> None:
        try:
            event = decode(msg.data, TerminalEvent)
        except DecodeError as exc:
            log.error("unreadable terminal event on %s: %s", msg.subject, exc)
            return
        request_id = msg.subject.split(".")[2]  # the subject is what the guard fenced
        if event.request_id != request_id:
            log.error("terminal event of request %s on the subject of %s; ignored", event.request_id, request_id)
            return
        follower = self._followers.get(request_id)
        if follower is not None:
            follower(event)
        for listener in self._listeners:
            listener(event)
