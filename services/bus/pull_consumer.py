"""Pull consumers with explicit acks: fetch only when the caller has room; say what happened to each message.

`ack` after success, `nak(delay)` for a retryable failure, `term` for an undecodable message (reported, never
retried), `in_progress` during long work. An undecodable message is termed and the loop serves the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode
from messages.errors import InvalidConfig
from services.bus.errors import NotProvisioned
from services.bus.logs import request_context
from services.bus.prompt_pull import PromptPull

log = logging.getLogger(__name__)
M = TypeVar("M")


class Delivery:
    """One delivered JetStream message and its explicit ack verbs."""

    def __init__(self, nc: Client, msg: Msg) -> None:
        self._nc = nc
        self.msg = msg
        self.settled = False

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers (the trace context among them); empty when it has none."""
        return dict(self.msg.headers or {})

    @property
    def num_delivered(self) -> int:
        """1 on first delivery, 2 on the first redelivery..."""
        return self.msg.metadata.num_delivered

    @property
    def stream_sequence(self) -> int:
        return self.msg.metadata.sequence.stream

    async def ack(self, *, confirmed: bool = False) -> None:
        """Done. `confirmed` waits for the server to record the ack (use when an ack decides ownership)."""
        if confirmed:
            await self.msg.ack_sync()
        else:
            await self.msg.ack()
        self.settled = True

    async def nak(self, delay_s: float | None = None) -> None:
        """Retryable failure: redeliver after `delay_s` (counts toward MaxDeliver)."""
        await self.msg.nak(delay=delay_s)
        self.settled = True

    async def term(self, reason: str) -> None:
        """Never redeliver (undecodable or otherwise hopeless); the reason goes to the server's advisory."""
        await self._nc.publish(self.msg.reply, b"+TERM " + reason.encode()[:256])
        self.settled = True

    async def in_progress(self) -> None:
        """Still working: restart the ack-wait timer."""
        await self.msg.in_progress()


class Capacity:
    """How many more messages the caller can take. The loop takes one slot per message it hands over; the
    caller gives the slot back when the work is done (`release`), which wakes a loop waiting for room.

    `kind` (a request's priority, where the consumer has several) is passed to `take` and `release` for subclasses
    that count kinds apart (decode keeps seats for interactive work); this one counts every slot alike."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise InvalidConfig(f"capacity limit must be >= 1, got {limit}")
        self.limit = limit
        self.in_use = 0
        self._freed = asyncio.Event()

    def room(self) -> int:
        return self.limit - self.in_use

    def room_for(self, kind: str | None) -> int:
        """Room for one kind of message; here every kind shares `room()`."""
        return self.room()

    def floor_for(self, kind: str | None) -> int:
        """Slots other kinds leave free for this kind while it has work; none here."""
        return 0

    def take(self, kind: str | None = None) -> None:
        if self.in_use >= self.limit:
            raise RuntimeError("Capacity.take() with no room")
        self.in_use += 1

    def release(self, kind: str | None = None) -> None:
        if self.in_use == 0:
            raise RuntimeError("Capacity.release() with nothing taken")
        self.in_use -= 1
        self._freed.set()

    def clear_released(self) -> None:
        """Forget earlier releases: `wait_released` then waits for the next one."""
        self._freed.clear()

    async def wait_released(self) -> None:
        """Until a slot is released (or `nudge`d) after the last `clear_released`."""
        await self._freed.wait()

    def nudge(self) -> None:
        """Room may have changed for another reason than `release` (a subclass's `room()` gate opened): wake a
        loop waiting for room so it looks again."""
        self._freed.set()

    async def wait_for_room(self) -> None:
        while self.room() <= 0:
            self._freed.clear()
            await self._freed.wait()


Handler = Callable[[M, Delivery], Awaitable[None]]


class PullConsumer(Generic[M]):
    """Fetches from a provisioned durable consumer, decodes each message as `message_type`, hands it to `handler`.

    The handler must settle the delivery (ack/nak/term) now or later; it owns one Capacity slot per message and
    releases it when the work ends. A handler that raises (without having released its slot) gets the slot
    released by the loop and the message nak'ed with `retry_delay_s`, unless it had settled it already.

    `concurrent`: each message's handler runs as its own task (their waits on the bus overlap), else one after
    another. Either way a message is handed over only with a free Capacity slot.

    A redelivery of a message whose earlier delivery's handler is still running here (its ack wait ran out while
    the bus was electing a leader, say) is left unsettled and not handed over: two handlers of one message would
    race each other, and the first one's ack or nak settles the message for both.
    """

    def __init__(self, js: JetStreamContext, nc: Client, *, stream: str, durable: str, message_type: Any,
                 handler: Handler, capacity: Capacity, max_batch: int = 16, fetch_timeout_s: float = 1.0,
                 retry_delay_s: float = 1.0, request_id_of: Callable[[Any], str | None] | None = None,
                 concurrent: bool = False,
                 on_refused: Callable[[DecodeError], Awaitable[None]] | None = None,
                 source: Any | None = None, kind_of: Callable[[Any], str | None] | None = None) -> None:
        self._js, self._nc = js, nc
        self.stream, self.durable = stream, durable
        self._type, self._handler, self.capacity = message_type, handler, capacity
        self._max_batch, self._fetch_timeout_s, self._retry_delay_s = max_batch, fetch_timeout_s, retry_delay_s
        self._request_id_of = request_id_of or (lambda m: getattr(m, "id", None) or getattr(m, "request_id", None))
        self._pull: Any | None = None
        self._source = source
        """Where messages come from when not from `durable` alone (decode's lanes: services.bus.laned_pull)."""
        self._kind_of = kind_of or (lambda _m: None)
        """The kind of a message, passed to Capacity.take (decode: the request's priority)."""
        self.num_termed = 0
        self.num_termed_by_code: Counter[str] = Counter()
        """Termed messages by the DecodeError's code (bad_message, unsupported_version), for the metrics."""
        self._on_refused = on_refused
        """Called with each termed message's DecodeError that names a readable request, so the owner can end
        that request with one terminal event (a message without a readable id is only termed and counted)."""
        self._concurrent = concurrent
        self._handling: set[asyncio.Task] = set()
        """The running handler tasks (concurrent mode), kept until they end and awaited when the loop stops."""
        self._in_hand: set[int] = set()
        """Stream sequences of the messages whose handler is running."""
        self.num_redelivered_in_hand = 0
        """Redeliveries that arrived while the earlier delivery's handler still ran (left to that handler)."""

    async def bind(self) -> None:
        """Bind to the durable consumer (or open the `source`); NotProvisioned if it does not exist."""
        if self._source is not None:
            await self._source.open()
            self._pull = self._source
            return
        try:
            await self._js.consumer_info(self.stream, self.durable)
        except NotFoundError as exc:
            raise NotProvisioned(f"consumer {self.durable} on stream {self.stream} does not exist: run "
                                 f"`voxmesh provision`") from exc
        pull = PromptPull(self._nc, self.stream, self.durable)
        await pull.open()
        self._pull = pull

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. Fetches at most `room()` messages, and nothing while there is no room."""
        if self._pull is None:
            await self.bind()
        try:
            while not stop.is_set():
                if self.capacity.room() <= 0:
                    await _first(self.capacity.wait_for_room(), stop.wait())
                    continue
                for msg in await self._pull.fetch(min(self.capacity.room(), self._max_batch), self._fetch_timeout_s):
                    delivery = Delivery(self._nc, msg)
                    if delivery.stream_sequence in self._in_hand:
                        self.num_redelivered_in_hand += 1
                        log.warning("message %d on %s redelivered while its earlier delivery is still handled here; "
                                    "left to that handler", delivery.stream_sequence, msg.subject)
                        continue
                    message = await self._decoded(delivery)
                    if message is None:
                        continue
                    self.capacity.take(self._kind_of(message))  # here, not in the task: the next fetch must see the slot taken
                    self._in_hand.add(delivery.stream_sequence)  # and here, for the same reason
                    if self._concurrent:
                        task = asyncio.create_task(self._handle(message, delivery))
                        self._handling.add(task)
                        task.add_done_callback(self._handling.discard)
                    else:
                        await self._handle(message, delivery)
        finally:
            if self._handling:
                await asyncio.gather(*self._handling, return_exceptions=True)

    async def close(self) -> None:
        """Drop the pull subscription. Call it before the connection drains: an expired pull leaves a status
        message in the subscription's queue that nobody reads, and `nc.drain()` would wait for it until its
        drain timeout."""
        pull, self._pull = self._pull, None
        if pull is not None and not self._nc.is_closed:
            await pull.close()

    async def _decoded(self, delivery: Delivery) -> M | None:
        """The message, or None when it is undecodable (then it is termed and counted)."""
        try:
            return decode(delivery.data, self._type)
        except DecodeError as exc:
            self.num_termed += 1
            self.num_termed_by_code[exc.code.value] += 1
            log.error("terminating undecodable message %d on %s (%s, request %s): %s", delivery.stream_sequence,
                      delivery.msg.subject, exc.code, exc.request_id, exc)
            await delivery.term(f"{exc.code}: {exc}")
            if exc.request_id is not None and self._on_refused is not None:
                try:
                    await self._on_refused(exc)
                except Exception:  # noqa: BLE001 - one bad message never stops the loop
                    log.exception("could not end request %s after its message was refused", exc.request_id)
            return None

    async def _handle(self, message: M, delivery: Delivery) -> None:
        """Run the handler on a message that holds a Capacity slot; a failing handler's slot comes back."""
        with request_context(self._request_id_of(message)):
            try:
                await self._handler(message, delivery)
            except Exception:
                log.exception("handler failed; nak with %.1fs delay", self._retry_delay_s)
                self.capacity.release(self._kind_of(message))
                if not delivery.settled:
                    await delivery.nak(self._retry_delay_s)
            finally:
                self._in_hand.discard(delivery.stream_sequence)


async def _first(*awaitables: Awaitable[Any]) -> None:
    """Wait until the first of `awaitables` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
