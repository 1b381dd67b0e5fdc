"""The gateway's supervisor: ends, through the terminal guard, the requests that no other stage can end.

- queued past their deadline (no decode replica claimed them): `failed`, code `timeout`, stage gateway;
- not ended within the end-to-end deadline (`request_timeout_s` after the gateway admitted them), whatever a stage
  did or failed to do: cancelled in every stage and `failed`, code `timeout`, stage gateway;
- MaxDeliver exhausted on REQUESTS (seen through the JetStream advisory): `failed`, code `poison`, stage decode;
- the vocoder owning the request's partition lost its lease and nobody re-claimed the partition within a grace
  period: `failed`, code `replica_lost`, stage vocoder;
- the client disconnected and did not come back within the resume window: `cancel.<id>` is written (every stage
  stops work), and a still-queued request is ended `cancelled` at once.
It also starts migrations: a request whose decode owner's lease is dead goes back on REQUESTS for a live decode
replica to take over (requeue.py).
Exactly one terminal per request: the guard refuses a second one, and the loser of a race logs and stands down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from messages import DecodeError, decode
from messages.errors import ErrorCode, Stage
from messages.events import Failed, TerminalEvent
from messages.records import CancelRecord
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM, request_lanes
from services.bus.advisories import MaxDeliveriesAdvisory, load_exhausted_message, watch_max_deliveries
from services.bus.claims import read_owner
from services.bus.errors import MESSAGE_GONE_CODES
from services.bus.kvstore import cancel_request
from services.bus.logs import request_context
from services.bus.terminal_guard import publish_terminal
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.live_requests import LiveRequests
from services.gateway.requests.mesh_liveness import partition_owner_alive
from services.gateway.requests.requeue import DeadOwnerRequeue, LeaseMemo
from services.gateway.requests.resume_window import ResumeWindow
from services.gateway.requests.terminal_feed import TerminalFeed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    """Timings of supervision.

    Attributes:
        check_interval_s: how often deadlines, vocoder leases and resume windows are checked.
        vocoder_grace_s: how long a partition may be without a live vocoder before its requests fail.
        resume_window_s: how long a disconnected client's request lives on before it is cancelled.
        request_timeout_s: how long a request may live in all, from its admission to its terminal event.
    """

    check_interval_s: float = 0.5
    vocoder_grace_s: float = 5.0
    resume_window_s: float = 30.0
    request_timeout_s: float = 300.0


@dataclass(slots=True)
class Supervised:
    """One request the gateway serves, until its terminal event is seen."""

    request: SynthesisRequest
    partition: int
    queue_seq: int | None
    stream: AudioStream | None
    started: bool = False
    vocoder_down_since: float | None = None
    client_gone_at: float | None = None
    cancelled: bool = False

    def progress(self) -> tuple[int, int]:
        """(audio chunks held without a gap, codec frames they cover), for a failure the gateway reports."""
        if self.stream is None:
            return 0, 0
        return self.stream.contiguous_chunks(), self.stream.frames_seen()


class Supervisor:
    """Watches the requests this gateway admitted. Start `run(stop)` as an owned task."""

    def __init__(self, nc: Client, js: JetStreamContext, kv: KeyValue, model: str, terminals: TerminalFeed,
                 policy: SupervisorPolicy = SupervisorPolicy()) -> None:
        self._nc, self._js, self._kv = nc, js, kv
        self.terminals = terminals
        """The gateway's one feed of terminal events: the audio streams follow their request's on it too."""
        terminals.listen(self._on_terminal)
        self._model = model
        self.policy = policy
        self.resume_window = ResumeWindow(policy.resume_window_s)
        """The one resume window of this gateway; the WebSocket resume registry reads the same."""
        self.live = LiveRequests()
        """The requests this gateway holds anything for: each watched one here, and each the synthesizer admits or
        streams (it holds them itself)."""
        self._watched: dict[str, Supervised] = {}
        self.requeue = DeadOwnerRequeue(js, kv)
        """Puts a request whose decode owner died back on REQUESTS (migration)."""

    def watch(self, request: SynthesisRequest, partition: int, queue_seq: int | None,
              stream: AudioStream | None) -> None:
        """Supervise `request` (call before publishing it, so a client that leaves meanwhile is still noticed)."""
        if request.id not in self._watched:
            self.live.hold(request.id)
        self._watched[request.id] = Supervised(request, partition, queue_seq, stream)

    def queued(self, request_id: str, queue_seq: int) -> None:
        """The request is on REQUESTS at `queue_seq` (so an ended request's queue slot can be freed)."""
        entry = self._watched.get(request_id)
        if entry is not None:
            entry.queue_seq = queue_seq

    def client_gone(self, request_id: str) -> None:
        """The client left before the request ended: cancel it unless it ends within the resume window."""
        entry = self._watched.get(request_id)
        if entry is not None and entry.client_gone_at is None:
            entry.client_gone_at = time.time()

    def client_left_at(self, request_id: str) -> float | None:
        """When the client of a watched request left (the instant its resume window runs from); None while it is
        there, or when the request is not watched here."""
        entry = self._watched.get(request_id)
        return None if entry is None else entry.client_gone_at

    def client_back(self, request_id: str, stream: AudioStream) -> bool:
        """A client that left resumed the request on `stream`: its resume-window clock stops.

        False when the request was already cancelled (the window ran out); True otherwise, including a request this
        supervisor no longer watches (it ended: its terminal was seen)."""
        entry = self._watched.get(request_id)
        if entry is None:
            return True
        if entry.cancelled:
            return False
        entry.client_gone_at = None
        entry.stream = stream
        return True

    async def cancel(self, request_id: str, reason: str, code: ErrorCode = ErrorCode.CANCELLED) -> bool:
        """Cancel a request now (the client asked, or read too slowly: `code`): `cancel.<id>` is written, and a
        request still queued is ended at once. False when it is not watched here or was already cancelled."""
        entry = self._watched.get(request_id)
        if entry is None or entry.cancelled:
            return False
        with request_context(request_id):
            await self._cancel(entry, reason, time.time(), code)
        return True

    def forget(self, request_id: str) -> None:
        """Stop supervising a request whose terminal event the gateway has seen."""
        self._unwatch(request_id)

    def _unwatch(self, request_id: str) -> None:
        if self._watched.pop(request_id, None) is not None:
            self.live.release(request_id)
        self.requeue.forget(request_id)

    def is_watching(self, request_id: str) -> bool:
        return request_id in self._watched

    async def run(self, stop: asyncio.Event) -> None:
        """Check every `check_interval_s` until `stop` is set; follow terminal events and poison advisories. The
        terminal feed is closed on the way out (the gateway's responses are done by then)."""
        await self.terminals.start()
        subscriptions = [  # every queue decode takes the model's requests from
            await watch_max_deliveries(self._nc, REQUESTS_STREAM, lane.durable, self._on_poison)
            for lane in request_lanes(self._model)
        ]
        try:
            while not stop.is_set():
                try:
                    await self.check(time.time())
                except Exception:  # a bus hiccup must not end supervision; the next pass retries
                    log.exception("supervision pass failed")
                try:
                    await asyncio.wait_for(stop.wait(), self.policy.check_interval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            for subscription in subscriptions:
                try:
                    await subscription.unsubscribe()
                except Exception as exc:
                    log.debug("unsubscribe at shutdown failed: %r", exc)
            await self.terminals.close()

    async def check(self, now: float) -> None:
        """One supervision pass over every watched request."""
        partitions: dict[int, tuple[str | None, bool]] = {}
        leases = LeaseMemo(self._kv, now)
        for entry in list(self._watched.values()):
            with request_context(entry.request.id):
                if entry.partition not in partitions:
                    partitions[entry.partition] = await partition_owner_alive(self._kv, entry.partition, now)
                await self._check_queue_deadline(entry, now)
                await self._check_request_timeout(entry, now)
                await self._check_vocoder(entry, *partitions[entry.partition], now)
                await self._check_resume_window(entry, now)
                if self.is_watching(entry.request.id):
                    await self.requeue.check(entry.request, leases)

    async def _check_queue_deadline(self, entry: Supervised, now: float) -> None:
        deadline = entry.request.deadline
        if entry.started or deadline is None or now < deadline or not self.is_watching(entry.request.id):
            return
        if await read_owner(self._kv, entry.request.id) is not None:
            entry.started = True  # a decode replica has it; from here decode and vocoder end it
            return
        waited = deadline - entry.request.created_at
        await self.fail(entry, ErrorCode.TIMEOUT, Stage.GATEWAY,
                        f"the request waited {waited:.1f}s in the queue and no decode replica took it: the mesh is "
                        "overloaded or no decode replica is running; retry later or add decode capacity")

    async def _check_request_timeout(self, entry: Supervised, now: float) -> None:
        """The end-to-end deadline: the backstop for any path on which no stage ends the request."""
        timeout_s = self.policy.request_timeout_s
        if now - entry.request.created_at < timeout_s or not self.is_watching(entry.request.id):
            return
        entry.started = entry.started or await read_owner(self._kv, entry.request.id) is not None
        await self.fail(entry, ErrorCode.TIMEOUT, Stage.GATEWAY,
                        f"the request did not end within {timeout_s:.1f}s (--request-timeout-s) and was cancelled "
                        "in every stage; the audio so far is valid: retry it, and check the decode and vocoder "
                        "logs for this request id")

    async def _check_vocoder(self, entry: Supervised, owner: str | None, alive: bool, now: float) -> None:
        if alive or not self.is_watching(entry.request.id):
            entry.vocoder_down_since = None
            return
        if entry.vocoder_down_since is None:
            entry.vocoder_down_since = now
            log.warning("partition %d has no live vocoder (owner %s); waiting %.1fs for a takeover",
                        entry.partition, owner or "none", self.policy.vocoder_grace_s)
            return
        if now - entry.vocoder_down_since < self.policy.vocoder_grace_s:
            return
        lost = (f"vocoder {owner}, owner of partition {entry.partition}, lost its lease" if owner
                else f"partition {entry.partition} has no vocoder")
        await self.fail(entry, ErrorCode.REPLICA_LOST, Stage.VOCODER,
                        f"{lost} and no vocoder took the partition over within {self.policy.vocoder_grace_s:.1f}s; "
                        "the audio so far is valid: retry the request, and check that vocoder replicas are running")

    async def _check_resume_window(self, entry: Supervised, now: float) -> None:
        gone = entry.client_gone_at
        if entry.cancelled or gone is None or self.resume_window.is_open(gone, now):
            return
        if not self.is_watching(entry.request.id):  # ended earlier in this pass
            return
        reason = (f"the client disconnected and did not resume within {self.resume_window.length_s:.1f}s; the "
                  "request was cancelled")
        await self._cancel(entry, reason, now)

    async def _cancel(self, entry: Supervised, reason: str, now: float,
                      code: ErrorCode = ErrorCode.CANCELLED) -> None:
        """Write `cancel.<id>` (every stage stops work); end a request no decode replica took yet right here."""
        entry.cancelled = True
        await cancel_request(self._kv, CancelRecord(request_id=entry.request.id, code=code, reason=reason, at=now))
        log.info("cancelled (%s): %s", code.value, reason)
        if not entry.started and await read_owner(self._kv, entry.request.id) is None:
            await self.fail(entry, code, Stage.GATEWAY, reason)
        else:
            entry.started = True  # decode stops on the cancel record and ends the request in-band

    async def fail(self, entry: Supervised, code: ErrorCode, stage: Stage, reason: str) -> bool:
        """Cancel the request everywhere and publish its `failed` terminal through the guard.

        True when this call ended it; False when another stage had (this one stands down)."""
        request = entry.request
        chunk_count, frames = entry.progress()
        await cancel_request(self._kv, CancelRecord(request_id=request.id, code=code, reason=reason, at=time.time()))
        # The queue slot goes before the terminal: a client that sees the end must never find its request queued.
        if entry.queue_seq is not None and not entry.started:
            await self._drop_from_queue(entry.queue_seq)
        event = Failed(request_id=request.id, at=time.time(), stage=stage, code=code, reason=reason, frames=frames,
                       chunk_count=chunk_count)
        won = await publish_terminal(self._js, request.id, event)
        self._unwatch(request.id)
        if won:
            log.warning("failed %s/%s: %s", stage.value, code.value, reason)
        return won

    async def _drop_from_queue(self, seq: int) -> None:
        """Free the queue slot of an ended request that no decode replica took."""
        try:
            await self._js.delete_msg(REQUESTS_STREAM, seq)
        except NotFoundError:
            pass  # already taken (acked) or removed
        except APIError as exc:
            if exc.err_code not in MESSAGE_GONE_CODES:
                raise
            # Already taken (acked) or removed, said as a server or request error: it must not abort the pass.

    def _on_terminal(self, event: TerminalEvent) -> None:
        self._unwatch(event.request_id)

    async def _on_poison(self, advisory: MaxDeliveriesAdvisory) -> None:
        entry = next((e for e in self._watched.values() if e.queue_seq == advisory.stream_seq), None)
        if entry is None:  # admitted by another (perhaps dead) gateway: read the request from the queue
            data = await load_exhausted_message(self._js, advisory)
            try:
                request = decode(data, SynthesisRequest) if data is not None else None
            except DecodeError as exc:
                log.error("poison message %d is not a request (%s); removing it", advisory.stream_seq, exc)
                request = None
            if request is None:
                await self._drop_from_queue(advisory.stream_seq)
                return
            entry = Supervised(request, 0, advisory.stream_seq, None)
        with request_context(entry.request.id):
            await self.fail(entry, ErrorCode.POISON, Stage.DECODE,
                            f"decode replicas failed to take this request {advisory.deliveries} times (MaxDeliver); "
                            "it was removed from the queue: check the decode logs for this request id")
