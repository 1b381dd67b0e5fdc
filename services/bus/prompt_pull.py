"""A durable consumer's messages pulled as soon as one is stored, with whatever else is stored beside it.

Why not nats-py's `PullSubscription.fetch(n)`: for n > 1, once its first probe finds nothing, it sends a lingering
request for n messages and, after the first one arrives, waits for the other n - 1 until its timeout (the server
closes a lingering request only when it is complete or expired). A lone message then waits up to the whole fetch
timeout: at one request at a time, requests on their way into decode and codes on their way into the vocoder would
wait on the grid of the fetch timeouts, longer than the request's own work.

Here one pull is two requests on the consumer's next-message subject, both answered into this pull's own inbox:
- a lingering request for one message, answered the moment one is stored (or with a 408 status when it expires);
- then, when the caller can take more, a no-wait request for the rest of the batch, answered at once with what is
  stored and closed by a 404 status when that is fewer.

A status left over from an earlier request (one the client stopped waiting for, say across a reconnect) can end a
wait early; that costs one more round, never a message: a message that arrives late stays queued on the inbox and
is the next pull's first.
"""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from messages import subjects

STATUS_HEADER = "Status"
HEARTBEAT_STATUS = "100"
EXPIRY_MARGIN_S = 0.5
"""How long past a lingering request's expiry the client still waits for the server's 408 before giving up on it."""
INBOX_PENDING_MSGS = 1 << 16
"""Messages the inbox may hold before the client drops them (nats-py's default of 512 is below some batches)."""


class PromptPull:
    """Pulls from one durable consumer into a private inbox. `open()` before the first `fetch`, `close()` after."""

    def __init__(self, nc: Client, stream: str, durable: str) -> None:
        self._nc = nc
        self._next_subject = subjects.consumer_next(stream, durable)
        self._inbox = ""
        self._sub: Subscription | None = None

    async def open(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, pending_msgs_limit=INBOX_PENDING_MSGS)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.unsubscribe()

    async def fetch(self, batch: int, timeout_s: float) -> list[Msg]:
        """Up to `batch` messages: waits up to `timeout_s` for the first, then takes what is stored now (no wait for
        more). An empty list when nothing came within `timeout_s`."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        first = await self._first(timeout_s)
        if first is None:
            return []
        messages = [first]
        if batch > 1:
            messages += await self._stored(batch - 1, timeout_s)
        return messages

    async def take_stored(self, count: int, timeout_s: float) -> list[Msg]:
        """Up to `count` messages stored now, without waiting for more (a no-wait request); `timeout_s` bounds the
        wait for the server's answer."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        queued = await self._queued()
        if queued is not None:
            return [queued] + (await self._stored(count - 1, timeout_s) if count > 1 else [])
        return await self._stored(count, timeout_s)

    async def _first(self, timeout_s: float) -> Msg | None:
        queued = await self._queued()
        if queued is not None:
            return queued
        await self._request({"batch": 1, "expires": int(timeout_s * 1e9)})
        return await self._answer(timeout_s + EXPIRY_MARGIN_S)

    async def _stored(self, count: int, timeout_s: float) -> list[Msg]:
        await self._request({"batch": count, "no_wait": True})
        messages: list[Msg] = []
        while len(messages) < count:
            message = await self._answer(timeout_s)
            if message is None:
                break
            messages.append(message)
        return messages

    async def _queued(self) -> Msg | None:
        """A message already on the inbox (one an earlier request delivered late), skipping stale statuses."""
        assert self._sub is not None, "PromptPull.open() first"
        while self._sub.pending_msgs > 0:
            message = await self._sub.next_msg()  # queued: returns at once
            if _status(message) is None:
                return message
        return None

    async def _request(self, body: dict) -> None:
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)

    async def _answer(self, timeout_s: float) -> Msg | None:
        """The next message on the inbox; None at a status that closes a request (404, 408, 409) or at the timeout."""
        assert self._sub is not None, "PromptPull.open() first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                message = await self._sub.next_msg(timeout=left)
            except asyncio.TimeoutError:  # nats-py's own TimeoutError is one too
                return None
            status = _status(message)
            if status is None:
                return message
            if status != HEARTBEAT_STATUS:
                return None


def _status(message: Msg) -> str | None:
    return message.headers.get(STATUS_HEADER) if message.headers else None
