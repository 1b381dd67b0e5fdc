"""A JetStream publish retried, with the same headers, until the stream acknowledges it or a bound is reached.

What a publish meets while the bus is changing (a stream's leader lost and a new one elected, the client's server
killed and the client reconnecting to another) is answered as one of: no ack before the timeout (the leader died
with the request, or no leader is there to answer: followers drop what they cannot store), "no responders" (503 from
the client's server: only a stream's leader listens on its subjects, so none does while there is no leader), or a JetStream API
error with code 503 (the cluster has no quorum for the moment). Each may hide a message that was stored: the
leader stored it, then died before the ack went out. So every retry repeats the same `Nats-Msg-Id` (and any
expectation header), and the stream's duplicate window turns a second copy into an acknowledgement of the first:
never a duplicate, never a drop, as long as the retries end inside the window (`AckRetry.total_s` and one attempt's timeout
are far below `BusConfig.duplicate_window_s`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError

from services.bus.connection import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class AckRetry:
    """How long one call is tried before its error is raised.

    An attempt that timed out has cost its whole timeout already: at most `timeouts` of them. An attempt answered at
    once that no leader is there ("no responders", 503: until a new leader wins an election, no server listens on the
    stream's subjects) is retried with `backoff` until `total_s` has passed since the first attempt. The default rides
    out a stream leader's election after a kill (the survivors wait out an election timeout of a few seconds before
    voting) and a client's reconnect to another server (a request lost with the old socket times out once)."""

    timeouts: int = 3
    total_s: float = 30.0
    backoff: Backoff = Backoff(base_s=0.1, max_s=2.0)


DEFAULT_RETRY = AckRetry()


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is what a publish meets during a leader election or a reconnect (worth the same retry)."""
    if isinstance(exc, APIError):  # before nats.errors.Error: every APIError is one, most are final
        return getattr(exc, "code", None) == SERVICE_UNAVAILABLE  # some (KeyNotFoundError) never set it
    return isinstance(exc, (nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.NoRespondersError,
                            NoStreamResponseError, nats.errors.ConnectionReconnectingError))


async def publish_acked(js: JetStreamContext, subject: str, payload: bytes, *, stream: str,
                        headers: dict[str, str], timeout_s: float = 5.0,
                        retry: AckRetry = DEFAULT_RETRY) -> api.PubAck:
    """Publish to `stream` and return its ack, retrying transient failures (`is_transient`) with the same headers;
    `headers` must carry a `Nats-Msg-Id`. Raises the last transient error once the retry's bounds are spent, and any
    other error (a refused expectation, a full queue) at once."""
    what = f"publish {headers.get(api.Header.MSG_ID.value)} on {subject}"
    return await retrying(lambda: js.publish(subject, payload, timeout=timeout_s, stream=stream,
                                             headers=dict(headers)), what, retry)


async def retrying(call: Callable[[], Awaitable[T]], what: str, retry: AckRetry = DEFAULT_RETRY) -> T:
    """`call()`'s result, calling again after each transient failure (`is_transient`) within `retry`'s bounds; the
    last transient error once they are spent, any other at once. For calls that are safe to repeat: a publish with
    a Msg-Id (and any expectation), a read, a compare-and-set whose caller checks a refusal."""
    deadline = time.monotonic() + retry.total_s
    timeouts = 0
    for attempt in itertools.count():
        try:
            return await call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            timeouts += isinstance(exc, asyncio.TimeoutError)  # nats' TimeoutError is one too
            delay = retry.backoff.delay(attempt)
            if timeouts >= retry.timeouts or time.monotonic() + delay >= deadline:
                raise
            log.warning("%s: %r (attempt %d); retrying in %.2fs", what, exc, attempt + 1, delay)
            await asyncio.sleep(delay)  # a backoff: nothing signals a new leader to a client
    raise AssertionError("unreachable: the loop returns or raises")
