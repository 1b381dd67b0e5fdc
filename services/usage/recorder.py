"""Every request's usage, recorded exactly once, whatever gateway or replica served it.

Why here and this way. A request's terminal event is the one fact every path ends in (DESIGN.md invariant 1): the
vocoder publishes it for a request that reached it, the gateway's supervisor for one that never did, and the
terminal guard lets the stream store exactly one per request. Counting at the publisher would miss the terminals of
a publisher killed between its terminal and its count, and would have to be written in every stage that ends
requests; counting at the gateway that streams the request would miss a request whose gateway died mid-stream.
So usage is counted from the stream, not from a process:

- One durable pull consumer (`usage`, provisioned on EVENTS, filtered to `tts.events.*.terminal`) is shared by
  every gateway. JetStream hands each terminal to one of them; one that dies before its ack gets it redelivered to
  another after the ack wait, and the consumer's position survives every gateway being down (it resumes where it
  stopped, as long as EVENTS still holds the terminal: its retention, 24 h, bounds that outage).
- The record goes on `tts.usage.<id>` (stream USAGE) with `Nats-Expected-Last-Subject-Sequence: 0`, the terminal
  guard's own fence, and `Nats-Msg-Id` = the request's id: a second record of a request (a redelivery after a
  gateway died between publish and ack, at any distance in time) is refused by the server, and this gateway acks
  the terminal and stands down. Only then is the terminal acked, so no terminal is acked unrecorded.
- Who asked (tenant), for which model and how many characters come from the request's `accepted` event, which the
  admitting gateway publishes on EVENTS right after queueing it. A terminal that arrives before it (a request that
  ends within milliseconds) is nak'ed and tried again; after ACCEPTED_DELIVERIES without it the record is written
  with an unknown tenant and model rather than never (logged).

The records are kept for `BusConfig.usage_max_age_s` (35 days) and read back as totals (services/usage/reader.py).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode, encode, subjects
from messages.events import Accepted, TerminalEvent
from messages.streams import EVENTS_STREAM, USAGE_CONSUMER, USAGE_STREAM
from messages.usage import UsageRecord
from services.bus.fencing import fenced_publish
from services.bus.pull_consumer import Capacity, Delivery, PullConsumer
from services.usage.record import usage_record

log = logging.getLogger(__name__)

ACCEPTED_DELIVERIES = 5
"""Deliveries of a terminal that wait for its request's `accepted` event before it is recorded without it."""
ACCEPTED_RETRY_S = 1.0
"""Delay before a terminal whose `accepted` event is not stored yet is delivered again."""
IN_FLIGHT = 32
"""Terminals one gateway records at once (each waits on two bus round trips)."""


async def publish_usage(js: JetStreamContext, record: UsageRecord) -> bool:
    """Store `record` on `tts.usage.<id>` unless the request has one; True when this call stored it."""
    ack = await fenced_publish(js, subjects.usage(record.request_id), encode(record), stream=USAGE_STREAM,
                               expected=0, msg_id=f"usage-{record.request_id}")
    return ack is not None and not ack.duplicate


async def accepted_event(js: JetStreamContext, request_id: str) -> Accepted | None:
    """The request's `accepted` event as EVENTS holds it; None when it has none (yet) or it cannot be read."""
    try:
        stored = await js.get_last_msg(EVENTS_STREAM, subjects.event(request_id, Accepted.KIND))
    except NotFoundError:
        return None
    try:
        return decode(stored.data, Accepted)
    except DecodeError as exc:
        log.error("unreadable accepted event of request %s: %s", request_id, exc)
        return None


class UsageRecorder:
    """Turns each terminal event of the `usage` consumer into one usage record (a background task of the gateway)."""

    def __init__(self, nc: Client, js: JetStreamContext) -> None:
        self._js = js
        self._capacity = Capacity(IN_FLIGHT)
        self._consumer = PullConsumer(js, nc, stream=EVENTS_STREAM, durable=USAGE_CONSUMER,
                                      message_type=TerminalEvent, handler=self._record, capacity=self._capacity,
                                      request_id_of=lambda event: event.request_id, concurrent=True)
        self.num_recorded = 0
        self.num_already_recorded = 0
        self._settled = asyncio.Condition()

    @property
    def num_settled(self) -> int:
        """Terminals this recorder has seen recorded: by itself, or already by another gateway."""
        return self.num_recorded + self.num_already_recorded

    async def until_settled(self, count: int) -> None:
        """Wait until `num_settled` reaches `count`."""
        async with self._settled:
            await self._settled.wait_for(lambda: self.num_settled >= count)

    async def run(self, stop: asyncio.Event) -> None:
        """Record until `stop` is set; the pull is closed on the way out (before the connection drains)."""
        try:
            await self._consumer.run(stop)
        finally:
            await self._consumer.close()

    async def _record(self, terminal: TerminalEvent, delivery: Delivery) -> None:
        # A handler that raises gets its slot back (and its terminal nak'ed) from the consumer's loop.
        await self._settle(terminal, delivery)
        self._capacity.release()

    async def _settle(self, terminal: TerminalEvent, delivery: Delivery) -> None:
        """Record the terminal and ack it; nak it while its `accepted` event may still come."""
        if delivery.msg.subject != subjects.terminal(terminal.request_id):
            await delivery.term(f"terminal of {terminal.request_id} on {delivery.msg.subject}")
            return
        accepted = await accepted_event(self._js, terminal.request_id)
        if accepted is None and delivery.num_delivered < ACCEPTED_DELIVERIES:
            await delivery.nak(ACCEPTED_RETRY_S)
            return
        if accepted is None:
            log.warning("request %s has no accepted event: its usage is recorded without tenant and model",
                        terminal.request_id)
        if await publish_usage(self._js, usage_record(terminal, accepted)):
            self.num_recorded += 1
        else:
            self.num_already_recorded += 1
            log.info("request %s already has its usage record; standing down", terminal.request_id)
        await delivery.ack()
        async with self._settled:
            self._settled.notify_all()
