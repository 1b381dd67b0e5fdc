"""One request's audio as the client must get it: in seq order, no gaps, no duplicates, then the outcome.

The stream subscribes to `tts.audio.<id>` and follows the request's terminal event on the gateway's TerminalFeed (read
from EVENTS through JetStream, so a refused duplicate is never seen) before the request is published (so nothing can
be missed), buffers chunks that arrive early, repairs gaps by re-decode, and completes once it holds chunks
0..chunk_count-1 and the terminal event. A `failed` terminal ends the iteration with RequestFailed after the audio
made so far. A stream that hears nothing for a while asks EVENTS for the terminal itself, and ends with
`bus_unavailable` once neither audio nor EVENTS has reached this gateway for the outage bound (bus_watch.py): a
gateway cut off from the mesh gives its clients a clear error, never silence.

The chunks it holds for a client that reads slower than the mesh makes them are bounded (ClientBuffer): past the
bound the stream drops them, has the request cancelled in every stage, and ends the iteration with `slow_client`.
Chunks arrive on the request's own subscription, so a slow client never makes another request's audio wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from messages import DecodeError, decode, subjects
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.errors import ErrorCode, Stage
from messages.events import Failed, TerminalEvent
from messages.frames import AudioChunk
from services.gateway.errors import RequestFailed
from services.gateway.requests.bus_watch import BusOutagePolicy, BusWatch
from services.gateway.requests.repair import GapRepair, RepairPolicy
from services.gateway.requests.terminal_feed import TerminalFeed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClientBuffer:
    """How much audio the gateway holds for one request's client.

    Attributes:
        max_seconds: audio received and not yet handed to the client, in seconds, past which the request is given
            up (None: no bound).
        on_overflow: awaited once when that happens (the synthesizer cancels the request in every stage).
    """

    max_seconds: float | None = None
    on_overflow: Callable[[], Awaitable[object]] | None = None


class AudioStream:
    """Reassembles one request's AudioChunks. Use `async with stream:` around publishing the request, then iterate
    `stream.chunks()`.

    Attributes:
        request_id: the request.
        partition: its vocoder partition (where re-decode requests go).
        next_seq: chunks 0..next_seq-1 have been handed to the client.
        terminal: the request's terminal event once seen.
        first_chunk_at: unix time the first chunk was handed to the client (first-packet latency).
    """

    def __init__(self, nc: Client, terminals: TerminalFeed, request_id: str, partition: int,
                 repair: RepairPolicy = RepairPolicy(), buffer: ClientBuffer = ClientBuffer(),
                 outage: BusOutagePolicy = BusOutagePolicy()) -> None:
        self.request_id = request_id
        self.partition = partition
        self.next_seq = 0
        self.terminal: TerminalEvent | None = None
        self.first_chunk_at: float | None = None
        self._nc = nc
        self._terminals = terminals
        self._repair = GapRepair(nc, request_id, partition, repair)
        self._bus = BusWatch(nc, request_id, outage)
        self._terminal_patience_s = repair.arrival_timeout_s
        self._changed = asyncio.Event()  # set by the subscriptions when a chunk or the terminal arrives
        self._pending: dict[int, AudioChunk] = {}
        self._held_samples = 0  # in _pending
        self._buffer = buffer
        self._overflow: RequestFailed | None = None
        self._subscriptions: list[Subscription] = []
        self._samples_seen = 0
        self._known_chunks = 0  # chunks 0..n-1 exist in the mesh (a resumed stream knows this)

    async def open(self) -> None:
        """Subscribe to the request's audio and follow its terminal event. Call before publishing the request."""
        self._subscriptions = [await self._nc.subscribe(subjects.audio(self.request_id), cb=self._on_audio)]
        await self._terminals.follow(self.request_id, self.note_terminal)

    async def close(self) -> None:
        """Stop listening (idempotent)."""
        self._terminals.unfollow(self.request_id)
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception as exc:  # a closed or draining connection: nothing left to release
                log.debug("request %s: unsubscribe failed: %r", self.request_id, exc)

    async def __aenter__(self) -> AudioStream:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def num_redecodes(self) -> int:
        """Re-decode requests this stream sent."""
        return self._repair.num_requests

    def contiguous_chunks(self) -> int:
        """How many chunks from seq 0 on the gateway holds without a gap (delivered or buffered)."""
        count = self.next_seq
        while count in self._pending:
            count += 1
        return count

    def expect_chunks(self, count: int) -> None:
        """Chunks 0..count-1 are known to exist (a resumed stream: the gateway had received them before the client
        left): any of them not held from `next_seq` on is a gap to repair at once, before a later chunk shows it."""
        self._known_chunks = max(self._known_chunks, count)

    def note_terminal(self, event: TerminalEvent) -> None:
        """Record the request's terminal event (from the feed, or read from EVENTS by a stream opened after it was
        published)."""
        if self.terminal is None:
            self.terminal = event
            self._bus.heard()
            self._changed.set()

    def frames_seen(self) -> int:
        """Codec frames covered by the audio received so far (for a failure the gateway reports)."""
        return self._samples_seen // SAMPLES_PER_FRAME

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        """Yield the audio in seq order; return after a `finished` terminal, raise RequestFailed after a `failed`
        one (or when a lost chunk cannot be re-decoded)."""
        while True:
            self._changed.clear()  # before looking, so a message landing while we look wakes the wait below
            if self._overflow is not None:
                raise self._overflow
            chunk = self._pending.pop(self.next_seq, None)
            if chunk is not None:
                self._held_samples -= chunk.num_samples
                if self.first_chunk_at is None:
                    self.first_chunk_at = time.time()
                self.next_seq += 1
                self._repair.progressed(self.next_seq)
                yield chunk
                continue
            if self.terminal is not None and self.next_seq >= self.terminal.chunk_count:
                break
            if self._has_gap():
                await self._repair_gap()
            else:
                self._repair.settled()
            await self._wait(self._wait_s())
            await self._hear_from_bus()
        if isinstance(self.terminal, Failed):
            raise RequestFailed.from_event(self.terminal)

    async def _repair_gap(self) -> None:
        """Ask for a re-decode of the first missing chunk. When that fails for a request that failed, the client
        gets the terminal's own error (its cause), not the repair's. A vocoder may refuse before the terminal
        reaches this gateway (it comes through EVENTS, the refusal straight back), so a repair that fails with no
        terminal seen yet waits a while for one."""
        try:
            await self._repair.ensure(self.next_seq)
        except RequestFailed:
            await self._terminal_within(self._terminal_patience_s)
            if isinstance(self.terminal, Failed):
                log.warning("request %s: chunks %d..%d of a failed request could not be re-decoded", self.request_id,
                            self.next_seq, self.terminal.chunk_count - 1)
                raise RequestFailed.from_event(self.terminal) from None
            raise

    async def _terminal_within(self, timeout_s: float) -> None:
        """Until the terminal has been seen, or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while self.terminal is None and (left := deadline - time.monotonic()) > 0:
            self._changed.clear()
            if self.terminal is None:
                await self._wait(left)

    def _has_gap(self) -> bool:
        """A later chunk arrived before the next one, or the terminal (or a resume) counts chunks we lack."""
        if self.next_seq < self._known_chunks:
            return True
        if self.terminal is not None:
            return self.next_seq < self.terminal.chunk_count
        return bool(self._pending)

    def _wait_s(self) -> float:
        """Until a repair is due again or the bus is to be asked whether it still reaches this gateway."""
        repair_s = self._repair.wait_s()
        return self._bus.wait_s() if repair_s is None else min(repair_s, self._bus.wait_s())

    async def _hear_from_bus(self) -> None:
        """After a wait with nothing new: when due, read the terminal from EVENTS (bus_watch.py); RequestFailed
        with `bus_unavailable` when neither audio nor EVENTS reached this gateway for the outage bound."""
        if self._changed.is_set():
            return
        terminal = await self._bus.check(self.contiguous_chunks())
        if terminal is not None:
            self.note_terminal(terminal)

    async def _wait(self, timeout_s: float | None) -> None:
        """Until a chunk or the terminal arrives, or `timeout_s` passes (a repair is due again)."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def _on_audio(self, msg: Msg) -> None:
        try:
            chunk = decode(msg.data, AudioChunk)
        except DecodeError as exc:
            log.error("request %s: dropping an unreadable audio message: %s", self.request_id, exc)
            return
        if chunk.request_id != self.request_id:
            log.error("request %s: dropping audio of request %s sent on our subject", self.request_id,
                      chunk.request_id)
            return
        if self._overflow is not None:
            return  # given up: the request is being cancelled
        self._bus.heard()
        if chunk.seq >= self.next_seq and chunk.seq not in self._pending:  # else a duplicate: already held
            self._pending[chunk.seq] = chunk
            self._held_samples += chunk.num_samples
            self._samples_seen = max(self._samples_seen, chunk.first_sample + chunk.num_samples)
            self._changed.set()
            limit = self._buffer.max_seconds
            if limit is not None and self._held_samples > limit * SAMPLE_RATE:
                await self._give_up(limit)

    async def _give_up(self, limit_s: float) -> None:
        """The client reads slower than the mesh makes its audio and the buffer is full: drop what is held, have
        the request cancelled in every stage, and end the iteration with `slow_client`."""
        held_s = self._held_samples / SAMPLE_RATE
        self._overflow = RequestFailed(
            ErrorCode.SLOW_CLIENT, f"the client read its audio slower than the mesh made it: the gateway held "
            f"{held_s:.1f}s of it unsent, over its {limit_s:g}s buffer (--client-buffer-s), so the request was "
            f"cancelled in every stage after {self.next_seq} chunks; read the stream as it arrives",
            stage=Stage.GATEWAY, chunk_count=self.next_seq)
        self._pending.clear()
        self._held_samples = 0
        self._changed.set()
        log.warning("request %s: client too slow (%.1fs of audio held); cancelling it", self.request_id, held_s)
        if self._buffer.on_overflow is not None:
            try:
                await self._buffer.on_overflow()
            except Exception:  # noqa: BLE001 - the supervisor's request timeout still ends it
                log.exception("request %s: could not cancel the request of a slow client", self.request_id)
