"""Migration through the decode service, on a real nats-server: a request whose owner died after emitting codes is
taken over (epoch 2) and continued from the frames in CODES, and its codes equal an undisturbed run's, chunk for
chunk; a wrong replay is caught by the same comparison. Past --max-migrations it ends `replica_lost` after the codes
already there; one whose codes already ended is not taken over.

The dead owner is played by the test: it claims the request, publishes its marker and the oracle's first chunks, and
holds no lease (it "died"); then the request is put on REQUESTS again, as the gateway's supervisor does."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from messages import subjects
from messages.errors import ErrorCode, Stage
from messages.events import Migrated, Started
from messages.frames import CodesChunk, CodesEnd, TakeoverMarker
from services.bus.claims import claim_request, read_owner
from services.bus.codes_publisher import CodesPublisher
from services.decode import service as decode_service
from services.decode.codes_stream import ChunkRule
from services.engine.engine import Engine
from services.engine.model_ops import replay_rows
from tests.unit.test_engine_preemption import drop_codebooks_1_to_15, shift_text_by_one  # the same wrong replays
from tests.support.decode_stubs import NUM_PARTITIONS, REPLICA, Oracle, running_decode, synthesis

TEXT = "speak and the voice"
FRAMES = 24
UNDISTURBED_CHUNKS = [2, 2, 4, 8, 8]  # ChunkRule(2, 8) over 24 frames
CHUNKS_BEFORE_DEATH = 3  # 2 + 2 + 4 = 8 frames


async def dead_owner_emitted(decode, request_id: str, frames: np.ndarray, *, num_chunks: int,
                             owners: tuple[str, ...] = ("decode-dead",), end: CodesEnd | None = None,
                             rule: ChunkRule = ChunkRule(2, 8)) -> None:
    """Play the dead owner(s): claims (one epoch each), the last one's marker and its first `num_chunks` chunks, cut
    by `rule`."""
    claim = None
    for owner in owners:
        claim = await claim_request(decode.kv, request_id, owner, current=claim)
    epoch = claim.record.epoch
    publisher = await CodesPublisher.take_over(
        decode.js, partition=subjects.partition_for(request_id, NUM_PARTITIONS), request_id=request_id, epoch=epoch,
        replica=owners[-1], last_sequence=0, resume_frame=0, next_seq=0)
    first = 0
    for seq in range(num_chunks):
        size = rule.size(seq)
        await publisher.publish(CodesChunk.from_frames(request_id=request_id, seq=seq, first_frame=first, epoch=epoch,
                                                       frames=frames[first:first + size]))
        first += size
    if end is not None:
        await publisher.publish(end)


@pytest.fixture(scope="module")
def oracle(tiny_checkpoint) -> Oracle:
    return Oracle(tiny_checkpoint)


@pytest.mark.parametrize(
    ("replay", "faithful"),
    [(replay_rows, True), (drop_codebooks_1_to_15, False), (shift_text_by_one, False)],
    ids=["faithful-replay", "replay-drops-codebooks-1-15", "replay-shifts-text-by-one"],
)
async def test_a_dead_owners_request_continues_from_its_codes_equal_to_an_undisturbed_run(
        nats_server, tiny_checkpoint, oracle, monkeypatch, replay, faithful):
    monkeypatch.setattr(decode_service, "Engine", functools.partial(Engine, replay=replay))
    # Text fed along the frames, so that a replay that shifts the text position changes the input.
    request = synthesis("migrated", TEXT, frames=FRAMES, seed=5, text_mode="streaming")
    undisturbed = oracle.codes(request)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await dead_owner_emitted(decode, request.id, undisturbed, num_chunks=CHUNKS_BEFORE_DEATH)
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
        stats = await decode.idle_stats()
    messages = decode.log.codes[request.id]
    markers = [m for m in messages if isinstance(m, TakeoverMarker)]
    assert [(m.epoch, m.replica, m.resume_frame, m.next_seq) for m in markers] == [
        (1, "decode-dead", 0, 0), (2, REPLICA, 8, CHUNKS_BEFORE_DEATH)]
    assert (owner.record.replica, owner.record.epoch) == (REPLICA, 2)
    assert end.reason == "finished" and (end.epoch, end.total_frames, end.seq) == (2, FRAMES, len(UNDISTURBED_CHUNKS))
    assert decode.log.chunk_sizes(request.id) == UNDISTURBED_CHUNKS, "the chunks an undisturbed run makes, once each"
    assert [m for m in messages if isinstance(m, CodesEnd)] == [end]
    assert np.array_equal(decode.log.frames(request.id), undisturbed) is faithful
    [migrated] = [e for e in decode.log.events[request.id] if isinstance(e, Migrated)]
    assert (migrated.from_replica, migrated.to_replica, migrated.epoch, migrated.frames_done) == (
        "decode-dead", REPLICA, 2, 8)
    assert stats["requests_migrated"] == 1 and stats["kv_blocks_in_use"] == 0 and stats["active_requests"] == 0


async def test_past_the_migration_limit_the_request_ends_replica_lost_after_its_codes(
        nats_server, tiny_checkpoint, oracle):
    request = synthesis("lost-twice", TEXT, frames=FRAMES)
    frames = oracle.codes(request)
    async with running_decode(nats_server.url, tiny_checkpoint, max_migrations=1) as decode:
        # Its first replica died, the one that took it over (epoch 2) died too: this would be a second migration.
        await dead_owner_emitted(decode, request.id, frames, num_chunks=2, owners=("decode-dead-1", "decode-dead-2"))
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
        stats = await decode.idle_stats()
    assert owner.record.epoch == 3 and end.epoch == 3, "the takeover itself went through, so no other replica tries"
    assert end.reason == "failed" and (end.error.code, end.error.stage) == (ErrorCode.REPLICA_LOST, Stage.DECODE)
    assert (end.seq, end.total_frames) == (2, 4), "the chunks already sent count, so the client gets their audio"
    assert "died 2 times" in end.error.message and "--max-migrations 1" in end.error.message
    assert not any(isinstance(e, (Started, Migrated)) for e in decode.log.events[request.id])
    assert stats["requests_migrated"] == 0 and stats["failures_by_code"] == {"replica_lost": 1}
    assert stats["kv_blocks_in_use"] == 0 and stats["active_requests"] == 0


async def test_a_dead_owners_request_whose_codes_ended_is_not_taken_over(nats_server, tiny_checkpoint, oracle):
    request, sentinel = synthesis("ended-then-died", TEXT, frames=4), synthesis("after-ended", TEXT, frames=4)
    frames = oracle.codes(request)
    ended = CodesEnd(request_id=request.id, seq=2, epoch=1, reason="finished", total_frames=4, stop="length")
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=1) as decode:
        await dead_owner_emitted(decode, request.id, frames, num_chunks=2, end=ended)
        claim = await read_owner(decode.kv, request.id)
        await decode.submit(request)
        await decode.submit(sentinel)
        assert (await decode.log.end(sentinel.id)).reason == "finished"
        owner = await read_owner(decode.kv, request.id)
    assert owner.revision == claim.revision, "its end is in CODES: the vocoder ends it, nobody takes it over"
    assert [type(m) for m in decode.log.codes[request.id]] == [TakeoverMarker, CodesChunk, CodesChunk, CodesEnd]


async def test_its_own_claim_left_unserved_after_a_bus_error_resumes_from_its_codes(nats_server, tiny_checkpoint,
                                                                                   oracle):
    # This replica claimed the request and sent two chunks, then lost it without an end (a bus error before the
    # ack: the message was nak'ed). Its redelivery continues from this replica's own claim and codes.
    request = synthesis("own-resumed", TEXT, frames=FRAMES)
    frames = oracle.codes(request)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await dead_owner_emitted(decode, request.id, frames, num_chunks=2, owners=(REPLICA,))
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
    assert (owner.record.replica, owner.record.epoch) == (REPLICA, 1) and end.epoch == 1
    assert end.reason == "finished" and decode.log.chunk_sizes(request.id) == UNDISTURBED_CHUNKS
    np.testing.assert_array_equal(decode.log.frames(request.id), frames)
    assert not any(isinstance(e, Migrated) for e in decode.log.events[request.id])


async def test_a_request_taken_over_keeps_the_first_chunk_size_its_dead_owner_chose(nats_server, tiny_checkpoint,
                                                                                    oracle):
    # The dead owner cut one-frame first chunks (its load chose them): 1, 1, 2. This replica's own default is two
    # frames, and it runs nothing else; the ramp goes on from one frame, as an undisturbed run of the owner's.
    request = synthesis("one-frame-owner", TEXT, frames=FRAMES, seed=6)
    undisturbed = oracle.codes(request)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await dead_owner_emitted(decode, request.id, undisturbed, num_chunks=3, rule=ChunkRule(1, 8))
        await decode.submit(request)
        end = await decode.log.end(request.id)
    sizes = decode.log.chunk_sizes(request.id)
    assert sizes == [ChunkRule(1, 8).size(seq) for seq in range(len(sizes) - 1)] + [sizes[-1]], sizes
    assert sizes[:5] == [1, 1, 2, 4, 8] and end.reason == "finished" and end.epoch == 2
    np.testing.assert_array_equal(decode.log.frames(request.id), undisturbed)


async def test_a_request_claimed_afresh_whose_codes_are_there_continues_from_them(nats_server, tiny_checkpoint, oracle):
    # A first claim fences its marker on an empty codes subject without reading it. Here the subject is not empty:
    # an owner emitted two chunks, then its `owner.<id>` key was lost. The fenced marker is refused, the next attempt
    # reads CODES, and the request goes on from those frames instead of starting over on top of them.
    request = synthesis("claimed-afresh", TEXT, frames=FRAMES)
    frames = oracle.codes(request)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await dead_owner_emitted(decode, request.id, frames, num_chunks=2, owners=("decode-gone",))
        await decode.kv.delete(subjects.owner_key(request.id))
        await decode.submit(request)
        end = await decode.log.end(request.id)
        owner = await read_owner(decode.kv, request.id)
    markers = [m for m in decode.log.codes[request.id] if isinstance(m, TakeoverMarker)]
    assert [(m.replica, m.resume_frame, m.next_seq) for m in markers] == [("decode-gone", 0, 0), (REPLICA, 4, 2)]
    assert (owner.record.replica, owner.record.epoch) == (REPLICA, 1) and end.reason == "finished"
    assert decode.log.chunk_sizes(request.id) == UNDISTURBED_CHUNKS
    np.testing.assert_array_equal(decode.log.frames(request.id), frames)
