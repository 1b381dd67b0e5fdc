"""Gap repair: ask the partition's vocoder to re-decode a request's audio from CODES, starting at a missing seq.

Audio travels on core NATS, so a chunk can be lost; chunking is a deterministic function of the codes, so a
re-decode yields the same numbered chunks and the stream keeps the ones it lacks. One repair is outstanding at a
time; a fruitless one (accepted, and the chunk still missing) is retried a bounded number of times, then the stream
fails with a reason. A request nobody answers is asked again, for as long as a JetStream leader election may take:
the vocoder reads the request's codes from CODES before it answers, and a chunk is most often lost when a NATS server
has just died, which is when CODES may be electing a leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client

from messages import DecodeError, decode, encode, subjects
from messages.errors import ErrorCode, Stage
from messages.requests import RedecodeReply, RedecodeRequest
from services.gateway.errors import RequestFailed
from services.gateway.requests.bus_watch import DEFAULT_BUS_OUTAGE_S

log = logging.getLogger(__name__)

_UNANSWERED = object()
"""What `GapRepair._ask` returns for a request no vocoder answered in time."""


@dataclass(frozen=True, slots=True)
class RepairPolicy:
    """How patiently a stream repairs gaps.

    Attributes:
        reply_timeout_s: wait this long for the vocoder to accept a re-decode request.
        arrival_timeout_s: after an accepted re-decode, wait this long for the missing chunk before asking again.
        max_attempts: re-decode requests per gap before the stream fails (requests nobody answered not counted).
        unanswered_patience_s: how long a gap's re-decode requests may go unanswered before the stream fails (the
            gateway's bound on a bus outage: above a leader election).
    """

    reply_timeout_s: float = 2.0
    arrival_timeout_s: float = 5.0
    max_attempts: int = 3
    unanswered_patience_s: float = DEFAULT_BUS_OUTAGE_S


class GapRepair:
    """Sends RedecodeRequests for one request and tracks the one outstanding."""

    def __init__(self, nc: Client, request_id: str, partition: int, policy: RepairPolicy) -> None:
        self._nc = nc
        self._request_id = request_id
        self._subject = subjects.redecode(partition)
        self._policy = policy
        self._from_seq: int | None = None
        self._attempts = 0
        self._retry_at = 0.0
        self._unanswered_since: float | None = None
        """When this gap's requests began to go unanswered (None: the last one was answered)."""
        self.num_requests = 0

    def progressed(self, next_seq: int) -> None:
        """The stream now holds every chunk below `next_seq`. A re-decode republishes every chunk from its seq on,
        so while one delivers, the chunks after it are under way too: it stays the outstanding repair (from the
        first chunk still missing, with a fresh deadline) instead of a new request per chunk."""
        if self._from_seq is not None and next_seq > self._from_seq:
            self._from_seq, self._attempts, self._unanswered_since = next_seq, 0, None
            self._retry_at = time.monotonic() + self._policy.arrival_timeout_s

    def settled(self) -> None:
        """No chunk is missing any more: nothing is outstanding."""
        self._from_seq, self._attempts, self._unanswered_since = None, 0, None

    def wait_s(self) -> float | None:
        """How long the stream may wait for the next message before this repair is due again (None: no repair)."""
        if self._from_seq is None:
            return None
        return max(0.0, self._retry_at - time.monotonic())

    async def ensure(self, from_seq: int) -> None:
        """Make sure a re-decode from `from_seq` is under way; RequestFailed when the gap cannot be repaired."""
        if self._from_seq == from_seq and time.monotonic() < self._retry_at:
            return
        if self._from_seq != from_seq:
            self._from_seq, self._attempts, self._unanswered_since = from_seq, 0, None
        if self._attempts >= self._policy.max_attempts:
            raise RequestFailed(ErrorCode.REPLICA_LOST, f"audio from chunk {from_seq} was lost and "
                                f"{self._attempts} re-decode requests on {self._subject} did not bring it back; "
                                "the vocoder of this partition may be down: retry the request",
                                stage=Stage.VOCODER, chunk_count=from_seq)
        unanswered_s = self._unanswered_s()
        if unanswered_s >= self._policy.unanswered_patience_s:
            raise RequestFailed(ErrorCode.REPLICA_LOST, f"audio from chunk {from_seq} was lost and re-decode "
                                f"requests on {self._subject} went unanswered for {unanswered_s:.1f} s; the vocoder "
                                "of this partition may be down: retry the request",
                                stage=Stage.VOCODER, chunk_count=from_seq)
        self.num_requests += 1
        asked_at = time.monotonic()
        self._retry_at = asked_at + self._policy.arrival_timeout_s
        log.info("request %s: chunk %d missing; asking %s to re-decode (attempt %d)", self._request_id, from_seq,
                 self._subject, self._attempts + 1)
        reply = await self._ask(from_seq)
        if reply is _UNANSWERED:
            # The vocoder reads CODES before it answers: during a leader election no answer comes in time. Such a
            # request is not an attempt; the gap's patience for them bounds the asking instead. Due again at once.
            if self._unanswered_since is None:
                self._unanswered_since = asked_at
            self._retry_at = time.monotonic()
            return
        self._unanswered_since = None
        self._attempts += 1
        if reply is not None and not reply.accepted:
            raise RequestFailed(ErrorCode.INTERNAL, f"audio from chunk {from_seq} was lost and the vocoder refused "
                                f"to re-decode it: {reply.reason or 'no reason given'}", stage=Stage.VOCODER,
                                chunk_count=from_seq)

    def _unanswered_s(self) -> float:
        """How long this gap's re-decode requests have gone unanswered (0: the last one was answered)."""
        return 0.0 if self._unanswered_since is None else time.monotonic() - self._unanswered_since

    async def _ask(self, from_seq: int) -> RedecodeReply | object | None:
        """The vocoder's reply; `_UNANSWERED` when none came in time; None when nobody listens (then due again after
        a pause) or the reply could not be read."""
        request = RedecodeRequest(request_id=self._request_id, from_seq=from_seq)
        try:
            msg = await self._nc.request(self._subject, encode(request), timeout=self._policy.reply_timeout_s)
        except nats.errors.NoRespondersError:
            # No vocoder listens right now (a partition takeover may be under way): try again after a pause.
            log.warning("request %s: nobody serves %s; will ask again", self._request_id, self._subject)
            self._retry_at = time.monotonic() + self._policy.reply_timeout_s
            return None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            log.warning("request %s: no answer to re-decode on %s; will ask again", self._request_id, self._subject)
            return _UNANSWERED
        try:
            return decode(msg.data, RedecodeReply)
        except DecodeError as exc:
            log.error("request %s: unreadable re-decode reply: %s", self._request_id, exc)
            return None
