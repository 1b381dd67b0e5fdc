"""Decode's codes append through a bus blip (`services/decode/publish_retry.py`): a bus error is appended again
within the attempts and the total time, whichever ends first; a fenced-out owner never is."""

from __future__ import annotations

import asyncio

import nats.errors
import numpy as np
import pytest
from nats.js.errors import APIError

from messages.frames import CodesChunk
from services.bus.connection import Backoff
from services.bus.errors import StaleOwner
from services.decode.publish_retry import PublishRetry, append_retrying

NO_WAIT = PublishRetry(attempts=4, backoff=Backoff(base_s=0.0, max_s=0.0))


class Clock:
    """The retry's clock, moved only by the publisher: time passes as the attempts say, never by the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedPublisher:
    """Raises each of `errors` on successive calls, then acknowledges with sequence 7; with a `clock`, each failing
    call moves it by `stall_s` (an attempt that waited out its own retries before it failed)."""

    def __init__(self, *errors: BaseException, clock: Clock | None = None, stall_s: float = 0.0) -> None:
        self.errors, self.clock, self.stall_s = list(errors), clock, stall_s
        self.calls = 0

    async def publish(self, message) -> int:
        self.calls += 1
        if self.errors:
            if self.clock is not None:
                self.clock.now += self.stall_s
            raise self.errors.pop(0)
        return 7


def _chunk() -> CodesChunk:
    return CodesChunk(request_id="req-1", seq=0, first_frame=0, epoch=1, dtype="int32",
                      codes=np.zeros((2, 16), dtype="<i4").tobytes())


def _store_full() -> APIError:
    return APIError(code=500, description="insufficient resources")


@pytest.mark.parametrize("error", [nats.errors.TimeoutError(), asyncio.TimeoutError(), nats.errors.NoRespondersError(),
                                   _store_full(), nats.errors.ConnectionClosedError()],
                         ids=["nats-timeout", "asyncio-timeout", "no-responders", "api-error", "closed"])
def test_a_bus_error_is_appended_again_until_it_lands(error) -> None:
    publisher = ScriptedPublisher(error, error)
    assert asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT)) == 7
    assert publisher.calls == 3


def test_a_bus_error_is_raised_after_every_attempt() -> None:
    publisher = ScriptedPublisher(*[nats.errors.TimeoutError() for _ in range(NO_WAIT.attempts + 1)])
    with pytest.raises(nats.errors.TimeoutError):
        asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT))
    assert publisher.calls == NO_WAIT.attempts


def test_no_attempt_starts_past_the_total_time() -> None:
    """Attempts that each spent 15 s before failing, within a total of 20 s: the third would start past it."""
    clock = Clock()
    retry = PublishRetry(attempts=10, backoff=Backoff(base_s=0.0, max_s=0.0), total_s=20.0)
    publisher = ScriptedPublisher(*[nats.errors.TimeoutError() for _ in range(10)], clock=clock, stall_s=15.0)
    with pytest.raises(nats.errors.TimeoutError):
        asyncio.run(append_retrying(publisher, _chunk(), retry, clock))
    assert publisher.calls == 2


def test_a_fenced_out_owner_is_never_retried() -> None:
    publisher = ScriptedPublisher(StaleOwner("another owner appended", subject="voxmesh.codes.0.req-1",
                                             expected_sequence=3))
    with pytest.raises(StaleOwner):
        asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT))
    assert publisher.calls == 1
