"""The durable pull consumer of one owned partition (`tts.codes.<n>.*`), with one lane per request.

The bus's PullConsumer fetches only while there is room and terms undecodable messages. Each decoded message goes to
its request's lane: a lane handles one message at a time in arrival order, and lanes of different requests run
concurrently, so their chunks reach the codec thread together and are decoded in one batched call.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry.trace import SpanKind

from messages import DecodeError
from messages.frames import CodesMessage
from messages.streams import CODES_STREAM, codes_consumer
from services.bus.pull_consumer import Capacity, Delivery, PullConsumer
from services.bus.trace_context import REQUEST_ID, extract, tracer
from services.vocoder.handler import CodesHandler

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]


class RequestLanes:
    """Per-key FIFO of work with one task per busy key; every task is kept and awaited or cancelled."""

    def __init__(self) -> None:
        self._pending: dict[str, deque[Work]] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def submit(self, key: str, work: Work) -> None:
        """Queue `work` behind the key's earlier work; start the key's task if it has none."""
        self._pending.setdefault(key, deque()).append(work)
        if key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key), name=f"vocoder-lane-{key}")

    async def _run(self, key: str) -> None:
        queue = self._pending[key]
        try:
            while queue:
                await queue.popleft()()
        finally:
            del self._pending[key]
            del self._tasks[key]

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every submitted piece of work is done."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every lane (queued work is dropped; its messages are redelivered by the server)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class PartitionConsumer:
    """Consumes one partition's codes until stopped, then finishes the work it already took."""

    def __init__(self, js: JetStreamContext, nc: Client, partition: int, handler: CodesHandler, *,
                 max_in_flight: int = 256, fetch_batch: int = 64, retry_delay_s: float = 0.5) -> None:
        self.partition = partition
        self._handler = handler
        self._retry_delay_s = retry_delay_s
        self._lanes = RequestLanes()
        self.capacity = Capacity(max_in_flight)
        self.pull: PullConsumer[CodesMessage] = PullConsumer(
            js, nc, stream=CODES_STREAM, durable=codes_consumer(partition), message_type=CodesMessage,
            handler=self._on_message, capacity=self.capacity, max_batch=fetch_batch, retry_delay_s=retry_delay_s,
            on_refused=self._on_refused)

    async def _on_refused(self, error: DecodeError) -> None:
        """A termed message that names its request: end that request, in its lane (after its earlier messages)."""
        request_id = error.request_id
        self._lanes.submit(request_id, lambda: self._handler.refuse(self.partition, error))

    async def bind(self) -> None:
        """Bind to the provisioned durable consumer (NotProvisioned if missing)."""
        await self.pull.bind()

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and handle until `stop` is set; then let the lanes finish (their messages get settled)."""
        try:
            await self.pull.run(stop)
        finally:
            await self._lanes.drain()
            await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        """Close the pull subscription: left open, it holds the connection's drain until the drain timeout."""
        try:
            await self.pull.close()
        except Exception as exc:  # a connection already closed: nothing left to release
            log.debug("partition %d: unsubscribe failed: %r", self.partition, exc)

    async def abort(self) -> None:
        """Stop handling at once (the partition was lost); unsettled messages are redelivered to the new owner."""
        await self._lanes.cancel()
        await self._unsubscribe()

    async def _on_message(self, message: CodesMessage, delivery: Delivery) -> None:
        self._lanes.submit(message.request_id, lambda: self._handle(message, delivery))

    async def _handle(self, message: CodesMessage, delivery: Delivery) -> None:
        # Each codes message continues its request's trace from decode's span (the message's headers carry it).
        span = tracer().start_as_current_span(
            "vocoder.codes", context=extract(delivery.headers), kind=SpanKind.CONSUMER,
            attributes={REQUEST_ID: message.request_id, "voxmesh.message": type(message).__name__,
                        "voxmesh.partition": self.partition})
        try:
            with span:
                await self._handler.handle(self.partition, message, delivery)
        except Exception:
            log.exception("codes message %d of %s failed; redelivering in %.1fs", delivery.stream_sequence,
                          message.request_id, self._retry_delay_s)
            if not delivery.settled:
                try:
                    await delivery.nak(self._retry_delay_s)
                except Exception as exc:  # connection gone: the server redelivers after the ack wait anyway
                    log.warning("could not nak message %d: %r", delivery.stream_sequence, exc)
        finally:
            self.capacity.release()
