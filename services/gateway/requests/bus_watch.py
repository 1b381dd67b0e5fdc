"""Whether a streaming request's gateway still hears from the bus, and the clear error when it has not for too long.

A request's audio comes on core NATS and its end through EVENTS (JetStream). A gateway whose NATS server lost its
routes to the rest of the cluster (a partitioned host), or whose connection is down, keeps a client waiting on
both: no chunk and no terminal can reach it, and the supervisor's deadlines cannot end the request either (they too
need the bus). So when a stream has heard nothing for a while, it reads the request's terminal from EVENTS itself:

- a stored terminal: the feed missed it; the stream takes it;
- none stored yet (the stream leader answered): the bus is fine and the request is only slow (queued, or a busy
  mesh); the stream waits on, and the supervisor's deadlines still bound it;
- no answer (a timeout, no responders, no quorum, a closed connection): the bus is unreachable from here. Once it
  has been so for `outage_s` with no chunk either, the client's stream ends with `bus_unavailable`.

That error is the client's view only: the request is not failed (the gateway could not publish a terminal anyway),
so on the other side of a partition it may still finish, and the client may resume it through another gateway with
its resume token within the resume window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode, subjects
from messages.errors import ErrorCode, Stage
from messages.events import TerminalEvent
from messages.streams import EVENTS_STREAM
from services.gateway.errors import RequestFailed

log = logging.getLogger(__name__)

# Well above a chunk's interval on a loaded mesh (the bus answering meanwhile keeps a stream waiting anyway) and
# above a JetStream leader election (a few seconds), short enough that a cut-off client is not left in silence.
DEFAULT_BUS_OUTAGE_S = 20.0
READS_PER_OUTAGE = 4  # reads of EVENTS within one outage bound: a single lost answer never ends a stream
NO_MESSAGE_FOUND = 10037  # JetStream's error code for "no message found": the stream answered


@dataclass(frozen=True, slots=True)
class BusOutagePolicy:
    """How long a stream may hear nothing from the bus.

    Attributes:
        outage_s: seconds without a chunk, a terminal or an answer from EVENTS, after which the client's stream
            ends with `bus_unavailable`.
    """

    outage_s: float = DEFAULT_BUS_OUTAGE_S

    def __post_init__(self) -> None:
        if self.outage_s <= 0:
            raise ValueError(f"the bus outage bound must be > 0 s, got {self.outage_s}")

    @property
    def read_every_s(self) -> float:
        """Silence after which EVENTS is read, and the bound on each read."""
        return self.outage_s / READS_PER_OUTAGE


class BusUnreachable(Exception):
    """EVENTS did not answer a read of a request's terminal."""


async def read_terminal(js: JetStreamContext, request_id: str, timeout_s: float) -> TerminalEvent | None:
    """The request's terminal as EVENTS' leader stores it (None: not yet); BusUnreachable when no answer came.

    Read through the stream leader (not a direct get, which any replica answers, a cut-off one too), so an answer
    proves the bus reaches the rest of the mesh."""
    try:
        raw = await asyncio.wait_for(js.get_last_msg(EVENTS_STREAM, subjects.terminal(request_id)), timeout_s)
    except NotFoundError as exc:
        if exc.err_code == NO_MESSAGE_FOUND:
            return None
        raise BusUnreachable(repr(exc)) from exc
    except (nats.errors.Error, asyncio.TimeoutError) as exc:  # JetStream's API errors are nats errors too
        raise BusUnreachable(repr(exc) or type(exc).__name__) from exc
    try:
        return decode(raw.data, TerminalEvent)
    except DecodeError as exc:
        log.error("request %s: unreadable stored terminal event: %s", request_id, exc)
        return None


class BusWatch:
    """One stream's view of the bus: when it last heard anything, and when EVENTS is to be read next."""

    def __init__(self, nc: Client, request_id: str, policy: BusOutagePolicy) -> None:
        self._nc = nc
        self._request_id = request_id
        self._policy = policy
        self._heard_at = time.monotonic()
        self._read_at = self._heard_at + policy.read_every_s

    def heard(self) -> None:
        """A chunk or the terminal arrived: the bus reaches this gateway."""
        self._heard_at = time.monotonic()
        self._read_at = self._heard_at + self._policy.read_every_s

    def wait_s(self) -> float:
        """How long the stream may wait for a message before EVENTS is to be read."""
        return max(0.0, self._read_at - time.monotonic())

    async def check(self, chunks_held: int) -> TerminalEvent | None:
        """When a read is due, read the request's terminal (a stored one is returned). RequestFailed with
        `bus_unavailable` when the bus has not answered for `outage_s` and nothing else came meanwhile."""
        if time.monotonic() < self._read_at:
            return None
        try:
            terminal = await read_terminal(self._nc.jetstream(), self._request_id, self._policy.read_every_s)
        except BusUnreachable as exc:
            self._read_at = time.monotonic() + self._policy.read_every_s
            silent_s = time.monotonic() - self._heard_at
            if silent_s < self._policy.outage_s:
                log.warning("request %s: no audio for %.1fs and EVENTS does not answer (%s); reading again in "
                            "%.1fs", self._request_id, silent_s, exc, self._policy.read_every_s)
                return None
            raise self._unavailable(silent_s, chunks_held) from exc
        self.heard()
        return terminal

    def _unavailable(self, silent_s: float, chunks_held: int) -> RequestFailed:
        log.warning("request %s: nothing from the bus for %.1fs; ending the client's stream with %s", self._request_id,
                    silent_s, ErrorCode.BUS_UNAVAILABLE.value)
        return RequestFailed(
            ErrorCode.BUS_UNAVAILABLE, f"this gateway has heard neither audio nor events of the request for "
            f"{silent_s:.1f}s (--bus-outage-s {self._policy.outage_s:g}): its NATS server is cut off from the mesh "
            f"or down. The {chunks_held} chunks sent are valid and the request may still finish elsewhere: resume it "
            "through another gateway with its resume_token, or send it again", stage=Stage.GATEWAY,
            chunk_count=chunks_held)
