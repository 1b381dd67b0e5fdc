"""A lost chunk's re-decode through a bus that does not answer for a while (a JetStream leader election after a NATS
server died: the vocoder reads CODES before it answers): requests nobody answered are asked again for as long as the
gap's patience allows, and only fruitless answered ones count against `max_attempts`. Real nats-server; the vocoder is
a subscriber on the partition's re-decode subject that stays silent as told."""

from __future__ import annotations

import pytest

from messages import encode, subjects
from messages.errors import ErrorCode
from messages.requests import RedecodeReply
from services.gateway.errors import RequestFailed
from services.gateway.requests.repair import GapRepair, RepairPolicy

REQUEST_ID = "req-gap"
REPLY_TIMEOUT_S = 0.05  # how long each unanswered request waits


async def _vocoder(nats_client, silent_for: int):
    """A vocoder that leaves the first `silent_for` re-decode requests unanswered and accepts the rest."""
    heard: list[object] = []

    async def on_request(msg) -> None:
        heard.append(msg)
        if len(heard) > silent_for:
            await msg.respond(encode(RedecodeReply(request_id=REQUEST_ID, accepted=True)))

    return heard, await nats_client.subscribe(subjects.redecode(0), cb=on_request)


async def test_unanswered_requests_do_not_use_up_the_attempts(nats_client) -> None:
    heard, sub = await _vocoder(nats_client, silent_for=5)
    repair = GapRepair(nats_client, REQUEST_ID, 0, RepairPolicy(reply_timeout_s=REPLY_TIMEOUT_S, max_attempts=3,
                                                                 arrival_timeout_s=30.0, unanswered_patience_s=30.0))
    try:
        for _ in range(6):  # five unanswered (each due again at once), then one accepted: no failure on the way
            await repair.ensure(1)
        assert len(heard) == 6
        assert repair.wait_s() > 0  # accepted: the chunk is awaited now, not asked for again
    finally:
        await sub.unsubscribe()


async def test_a_gap_whose_requests_stay_unanswered_fails_after_its_patience(nats_client) -> None:
    heard, sub = await _vocoder(nats_client, silent_for=10**6)
    patience_s = 0.4
    repair = GapRepair(nats_client, REQUEST_ID, 0, RepairPolicy(reply_timeout_s=REPLY_TIMEOUT_S, max_attempts=3,
                                                                 unanswered_patience_s=patience_s))
    try:
        with pytest.raises(RequestFailed) as failed:
            for _ in range(1000):  # bounded: the patience ends it after about patience_s / REPLY_TIMEOUT_S asks
                await repair.ensure(1)
        assert failed.value.code is ErrorCode.REPLICA_LOST
        assert "went unanswered" in failed.value.message and "chunk 1" in failed.value.message
        assert len(heard) > 3  # more than max_attempts: unanswered requests were not counted as attempts
    finally:
        await sub.unsubscribe()


async def test_answered_fruitless_requests_are_bounded_by_max_attempts(nats_client) -> None:
    heard, sub = await _vocoder(nats_client, silent_for=0)
    repair = GapRepair(nats_client, REQUEST_ID, 0, RepairPolicy(reply_timeout_s=1.0, max_attempts=3,
                                                                 arrival_timeout_s=0.0))
    try:
        for _ in range(3):  # accepted each time, and the chunk never comes (due again at once)
            await repair.ensure(1)
        with pytest.raises(RequestFailed, match="3 re-decode requests .* did not bring it back"):
            await repair.ensure(1)
        assert len(heard) == 3
    finally:
        await sub.unsubscribe()
