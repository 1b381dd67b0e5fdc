"""Decode's codes append through a bus blip (`services/decode/publish_retry.py`): the errors `fenced_publish` rides
out itself are not retried again on top of its own bound; the others are, a bounded number of times; a fenced-out
owner never is."""

from __future__ import annotations

import asyncio

import nats.errors
import numpy as np
import pytest
from nats.js.errors import APIError

from messages.frames import CodesChunk
from services.bus.errors import StaleOwner
from services.bus.connection import Backoff
from services.decode.publish_retry import PublishRetry, append_retrying

NO_WAIT = PublishRetry(attempts=4, backoff=Backoff(base_s=0.0, max_s=0.0))


class ScriptedPublisher:
    """Raises each of `errors` on successive calls, then acknowledges with sequence 7."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def publish(self, message) -> int:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return 7


def _chunk() -> CodesChunk:
    return CodesChunk(request_id="req-1", seq=0, first_frame=0, epoch=1, dtype="int32",
                      codes=np.zeros((2, 16), dtype="<i4").tobytes())


def _store_full() -> APIError:
    return APIError(code=500, description="insufficient resources")


@pytest.mark.parametrize("error", [nats.errors.TimeoutError(), asyncio.TimeoutError(), nats.errors.NoRespondersError()],
                         ids=["nats-timeout", "asyncio-timeout", "no-responders"])
def test_an_error_fenced_publish_already_retried_is_raised_at_once(error) -> None:
    publisher = ScriptedPublisher(error)
    with pytest.raises(type(error)):
        asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT))
    assert publisher.calls == 1


def test_another_bus_error_is_retried_until_the_append_lands() -> None:
    publisher = ScriptedPublisher(_store_full(), nats.errors.ConnectionClosedError())
    assert asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT)) == 7
    assert publisher.calls == 3


def test_another_bus_error_is_raised_after_every_attempt() -> None:
    publisher = ScriptedPublisher(*[_store_full() for _ in range(NO_WAIT.attempts + 1)])
    with pytest.raises(APIError):
        asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT))
    assert publisher.calls == NO_WAIT.attempts


def test_a_fenced_out_owner_is_never_retried() -> None:
    publisher = ScriptedPublisher(StaleOwner("another owner appended", subject="voxmesh.codes.0.req-1", expected_sequence=3))
    with pytest.raises(StaleOwner):
        asyncio.run(append_retrying(publisher, _chunk(), NO_WAIT))
    assert publisher.calls == 1
