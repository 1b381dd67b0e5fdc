"""Resume: a WebSocket client that lost its connection comes back within the resume window with a request id and
the last chunk it received, and gets exactly the chunks after it.

While the client is away the request goes on in the mesh (the supervisor cancels it once the window has passed);
audio is not stored anywhere, so the missing chunks are re-decoded by the partition's vocoder from CODES (the
deterministic chunking gives the same numbered chunks), and the rest arrive live. The gateway that streamed a request
remembers it for the window: a resume goes to that gateway, or, when that gateway died, to any (orphan_resume.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode, subjects
from messages.errors import ErrorCode
from messages.events import TerminalEvent
from messages.streams import EVENTS_STREAM
from services.bus.logs import request_context
from services.gateway.errors import GatewayError
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.resume_window import ResumeWindow
from services.gateway.requests.synthesis import Synthesizer

log = logging.getLogger(__name__)

MAX_REMEMBERED_EXPIRED = 4096  # ids kept after their window, so a late resume hears why it is refused
HANDOVER_WAIT_S = 5.0  # a resume may arrive before the server has seen the old socket close


class ResumeRefused(GatewayError):
    """A `resume` the gateway cannot serve: unknown request, window over, still attached, or a bad last_seq."""


@dataclass(frozen=True, slots=True)
class ParkedRequest:
    """A request whose client left before it had all the audio.

    Attributes:
        request_id: the request.
        partition: its vocoder partition (where re-decodes go).
        sent: chunks 0..sent-1 were sent to the client.
        received: chunks 0..received-1 reached the gateway (so they exist in CODES).
        left_at: unix time the client was seen gone: the instant the supervisor's resume window runs from.
    """

    request_id: str
    partition: int
    sent: int
    received: int
    left_at: float


class ResumeRegistry:
    """The requests of this gateway's WebSocket clients: attached to a live socket, or parked for the window."""

    def __init__(self, window: ResumeWindow, handover_wait_s: float = HANDOVER_WAIT_S) -> None:
        self.window = window
        self.handover_wait_s = handover_wait_s
        self._attached: dict[str, asyncio.Event] = {}  # set when the socket lets the request go
        self._parked: dict[str, ParkedRequest] = {}
        self._expired: OrderedDict[str, float] = OrderedDict()  # request id -> when its client left
        self._ended: OrderedDict[str, None] = OrderedDict()
        """Requests whose audio this gateway delivered in full (or that failed to their client): a resume of one is
        refused, never adopted from the bus as an orphan's would be."""

    def attach(self, request_id: str) -> None:
        """A socket streams this request now."""
        self._attached.setdefault(request_id, asyncio.Event())

    def detach(self, request_id: str) -> None:
        """The request's audio was delivered in full (or it failed): nothing to resume."""
        self._release(request_id)
        self._ended[request_id] = None
        self._ended.move_to_end(request_id)
        while len(self._ended) > MAX_REMEMBERED_EXPIRED:
            self._ended.popitem(last=False)

    def _release(self, request_id: str) -> None:
        """No socket streams the request any more."""
        released = self._attached.pop(request_id, None)
        if released is not None:
            released.set()

    def park(self, parked: ParkedRequest) -> None:
        """The socket streaming the request is gone; a resume may take it until the window ends."""
        self._expire_old(parked.left_at)  # nothing else prunes requests nobody came back for
        self._parked[parked.request_id] = parked
        self._release(parked.request_id)

    def expire(self, request_id: str, left_at: float) -> None:
        """The request can no longer be resumed (its window ended, or the mesh cancelled it)."""
        self._parked.pop(request_id, None)
        self._expired[request_id] = left_at
        self._expired.move_to_end(request_id)
        while len(self._expired) > MAX_REMEMBERED_EXPIRED:
            self._expired.popitem(last=False)

    async def claim(self, request_id: str, last_seq: int | None) -> ParkedRequest:
        """Take a parked request for a resuming socket (it is attached to it from here on). A request still
        attached to a socket is waited for a moment (the client may see its connection drop before the server
        does). Raises ResumeRefused."""
        released = self._attached.get(request_id)
        if released is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(released.wait(), self.handover_wait_s)
        return self.take(request_id, last_seq, time.time())

    def is_unknown(self, request_id: str) -> bool:
        """Whether this gateway never streamed the request (or forgot it long ago): a resume may adopt it from the
        bus (orphan_resume.py)."""
        return not any(request_id in known for known in (self._parked, self._attached, self._expired, self._ended))

    def take(self, request_id: str, last_seq: int | None, now: float) -> ParkedRequest:
        """`claim` without waiting for a socket to let the request go."""
        self._expire_old(now)
        parked = self._parked.get(request_id)
        if parked is None:
            raise self._refusal(request_id, now)
        if last_seq is not None and last_seq >= parked.sent:
            raise ResumeRefused(ErrorCode.OUT_OF_RANGE, f"last_seq {last_seq} was never sent: request "
                                f"{request_id} had sent chunks 0..{parked.sent - 1}", param="last_seq")
        del self._parked[request_id]
        self.attach(request_id)
        return parked

    def _expire_old(self, now: float) -> None:
        for parked in [p for p in self._parked.values() if not self.window.is_open(p.left_at, now)]:
            self.expire(parked.request_id, parked.left_at)

    def _refusal(self, request_id: str, now: float) -> ResumeRefused:
        if request_id in self._expired:
            away = now - self._expired[request_id]
            return ResumeRefused(ErrorCode.CANCELLED, f"request {request_id} cannot be resumed: its client left "
                                 f"{away:.1f}s ago, past the {self.window.length_s:g}s resume window, so it was cancelled "
                                 "and its undelivered audio dropped; send the text again as a new request",
                                 param="request_id")
        if request_id in self._attached:
            return ResumeRefused(ErrorCode.NOT_RESUMABLE, f"request {request_id} is still streaming on another "
                                 "connection; close that one, then resume", param="request_id")
        if request_id in self._ended:
            return ResumeRefused(ErrorCode.NOT_RESUMABLE, f"request {request_id} is not resumable: its audio was "
                                 "already delivered in full (or it failed) on this gateway", param="request_id")
        return ResumeRefused(ErrorCode.NOT_RESUMABLE, f"request {request_id} is not resumable on this gateway: "
                             "it is unknown here, or its audio was already delivered in full (resume goes to the "
                             "gateway that streamed the request)", param="request_id")


@contextlib.asynccontextmanager
async def resumed_stream(synthesizer: Synthesizer, registry: ResumeRegistry, parked: ParkedRequest,
                         from_seq: int) -> AsyncIterator[AudioStream]:
    """The request's AudioStream from chunk `from_seq` on: listening again, its terminal read back from EVENTS if
    it ended meanwhile, and a re-decode asked at once for the chunks the gateway had received before. Raises
    ResumeRefused when the supervisor already cancelled the request."""
    request_id = parked.request_id
    stream = synthesizer.audio_stream(request_id, parked.partition)
    stream.next_seq = from_seq
    live = synthesizer.supervisor.live
    live.hold(request_id)
    with request_context(request_id), contextlib.ExitStack() as release:
        release.callback(live.release, request_id)
        async with stream:  # listening before the terminal is read back, so it cannot slip between the two
            if not synthesizer.supervisor.client_back(request_id, stream):
                registry.expire(request_id, parked.left_at)
                raise ResumeRefused(ErrorCode.CANCELLED, f"request {request_id} cannot be resumed: its resume "
                                    "window ran out and it was cancelled", param="request_id")
            terminal = await stored_terminal(synthesizer.js, request_id)
            if terminal is not None:
                stream.note_terminal(terminal)
            stream.expect_chunks(parked.received)
            log.info("client resumed from chunk %d (%d sent before, %d received)", from_seq, parked.sent,
                     parked.received)
            try:
                yield stream
            finally:
                if stream.terminal is None:
                    synthesizer.supervisor.client_gone(request_id)
                else:
                    synthesizer.supervisor.forget(request_id)


async def stored_terminal(js: JetStreamContext, request_id: str) -> TerminalEvent | None:
    """The request's terminal event as EVENTS holds it, or None while it has none."""
    try:
        raw = await js.get_last_msg(EVENTS_STREAM, subjects.terminal(request_id))
    except NotFoundError:
        return None
    try:
        return decode(raw.data, TerminalEvent)
    except DecodeError as exc:
        log.error("request %s: unreadable stored terminal event: %s", request_id, exc)
        return None
