"""Decode resolves a delivered request whose `owner.<id>` already exists by the owner's lease, on a real nats-server
with the real decode service: its own earlier claim is served at that epoch, a dead owner's is taken over (epoch 2),
a live other owner's is acked and skipped (a dead owner that had emitted codes: test_decode_migration.py).

With one sequence slot, decode pulls the next request only once the one before has been handled, so a plain request
queued after a skipped one is the sentinel that the skip happened."""

from __future__ import annotations

from messages.events import Started
from messages.streams import REQUESTS_STREAM
from services.bus.claims import claim_request, read_owner
from services.bus.leases import LeaseKeeper
from tests.support.decode_stubs import REPLICA, running_decode, synthesis, takeover_then

TEXT = "hello the voice"


def started_epochs(decode, request_id: str) -> list[int]:
    return [e.epoch for e in decode.log.events[request_id] if isinstance(e, Started)]


async def test_its_own_earlier_claim_is_served_at_that_epoch(nats_server, tiny_checkpoint):
    request = synthesis("own-claim", TEXT, frames=6)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        claim = await claim_request(decode.kv, request.id, REPLICA)  # as if an earlier delivery had claimed it
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
    marker, _ = takeover_then(decode.log, request.id)
    assert end.reason == "finished" and (marker.epoch, end.epoch) == (1, 1)
    assert owner.revision == claim.revision and started_epochs(decode, request.id) == [1]


async def test_a_dead_owners_request_is_taken_over_at_the_next_epoch(nats_server, tiny_checkpoint):
    request = synthesis("dead-owner", TEXT, frames=6)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await claim_request(decode.kv, request.id, "decode-dead")  # claimed, then died before acking: no lease
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
    marker, _ = takeover_then(decode.log, request.id)
    assert end.reason == "finished" and (marker.epoch, marker.replica, end.epoch) == (2, REPLICA, 2)
    assert (owner.record.replica, owner.record.epoch) == (REPLICA, 2) and started_epochs(decode, request.id) == [2]


async def test_a_live_other_owners_request_is_acked_and_left_alone(nats_server, tiny_checkpoint):
    theirs, sentinel = synthesis("live-owner", TEXT, frames=6), synthesis("after-live", TEXT, frames=4)
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=1) as decode:
        await LeaseKeeper(decode.kv, "decode-other", "decode", interval_s=1.0, ttl_s=60.0).renew()
        claim = await claim_request(decode.kv, theirs.id, "decode-other")
        await decode.submit(theirs)
        await decode.submit(sentinel)
        assert (await decode.log.end(sentinel.id)).reason == "finished"
        owner = await read_owner(decode.kv, theirs.id)
        queued = (await decode.js.stream_info(REQUESTS_STREAM)).state.messages
    assert owner.revision == claim.revision  # untouched
    assert theirs.id not in decode.log.codes and not started_epochs(decode, theirs.id)
    assert queued == 0  # acked, not left for redelivery
