"""The vocoder under faults, on a real nats-server with a real tiny codec: bad messages, a dead decode owner, a
racing terminal publisher, a stale owner epoch, and more requests than it may voice at once."""

from __future__ import annotations

import json
import time

import numpy as np

from messages import encode, subjects
from messages.errors import ErrorCode, Stage
from messages.events import Failed, Finished
from messages.frames import CodesChunk
from messages.streams import CODES_STREAM, codes_consumer
from services.bus.claims import claim_request, read_owner
from services.bus.codes_publisher import CodesPublisher
from services.bus.fencing import last_subject_sequence
from services.bus.leases import LeaseKeeper
from services.bus.terminal_guard import publish_terminal
from tests.support.vocoder_stubs import (
    NUM_PARTITIONS,
    WAIT_S,
    Listener,
    StandInDecode,
    bus,  # noqa: F401 (fixture)
    chunk_sizes,
    codec_decoder,  # noqa: F401 (fixture)
    codec_model_dir,  # noqa: F401 (fixture)
    full_decode_pcm,
    pcm_of,
    random_codes,
    running_vocoder,
    settled_status,
    status,
    stored_terminals,
)


async def serve_one(bus, request_id: str, codes: np.ndarray) -> tuple[Listener, object]:
    """A whole well-formed request through the running vocoder; returns its listener and terminal."""
    stand_in = StandInDecode(bus, request_id)
    listener = await Listener.open(bus.nc, request_id)
    await stand_in.start()
    await stand_in.chunks(codes, chunk_sizes(codes.shape[0]))
    await stand_in.finish()
    return listener, await listener.terminal()


async def test_undecodable_messages_are_termed_and_the_next_request_is_served(bus, codec_model_dir, codec_decoder):
    size = codec_decoder.config.codebook_size
    garbage_id, bad_codes_id, good_id = "req-garbage", "req-bad-codes", "req-after"
    partition = subjects.partition_for(garbage_id, NUM_PARTITIONS)
    advisories = await bus.nc.subscribe(subjects.terminated_advisory(CODES_STREAM, codes_consumer(partition)))
    bad_listener = await Listener.open(bus.nc, bad_codes_id)
    async with running_vocoder(bus, codec_model_dir):
        ack = await bus.js.publish(subjects.codes(partition, garbage_id), b"\x93not a codes message")
        advisory = json.loads((await advisories.next_msg(timeout=WAIT_S)).data)

        bad = StandInDecode(bus, bad_codes_id)
        await bad.start()
        out_of_range = np.full((2, 16), size + 7, dtype=np.int64)
        await bad.chunk(out_of_range)
        bad_terminal = await bad_listener.terminal()

        listener, terminal = await serve_one(bus, good_id, random_codes(10, size, seed=4))
        stats = await settled_status(bus, "vocoder-test", lambda s: s["active_streams"] == 0)

    assert advisory["stream_seq"] == ack.seq, "the undecodable message itself was termed"
    assert isinstance(bad_terminal, Failed)
    assert (bad_terminal.stage, bad_terminal.code, bad_terminal.chunk_count) == (Stage.VOCODER,
                                                                               ErrorCode.BAD_MESSAGE, 0)
    assert str(size) in bad_terminal.reason, "the reason says what was wrong with the codes"
    assert isinstance(terminal, Finished) and terminal.chunk_count == 2
    assert stats["messages_termed"] == 1 and stats["active_streams"] == 0


MIGRATION_GRACE_S = 1.0


async def test_dead_decode_owner_nobody_takes_over_ends_the_request_with_replica_lost(bus, codec_model_dir,
                                                                                    codec_decoder):
    codes = random_codes(2, codec_decoder.config.codebook_size, seed=5)
    async with running_vocoder(bus, codec_model_dir, decode_migration_grace_s=MIGRATION_GRACE_S):
        stand_in = StandInDecode(bus, "req-orphan", replica="decode-doomed", lease_ttl_s=30.0)
        listener = await Listener.open(bus.nc, "req-orphan")
        await stand_in.start()
        await stand_in.chunk(codes)
        first = await listener.next_audio()
        # The replica's last renewal, with a short ttl: from here on nobody renews it (the process "died").
        await LeaseKeeper(bus.kv, "decode-doomed", "decode", interval_s=0.1, ttl_s=0.5).renew()
        lapsed_after = time.time()
        terminal = await listener.terminal()
        stats = await settled_status(bus, "vocoder-test", lambda s: s["decode_owners_lost"] == 1)

    assert first.seq == 0
    assert isinstance(terminal, Failed)
    assert (terminal.stage, terminal.code) == (Stage.DECODE, ErrorCode.REPLICA_LOST)
    assert (terminal.frames, terminal.chunk_count) == (2, 1), "the audio already sent is accounted for"
    assert "decode-doomed" in terminal.reason and "Retry" in terminal.reason
    assert terminal.at >= lapsed_after + 0.5 + MIGRATION_GRACE_S - 0.05, "not before the migration grace ran out"
    assert stats["decode_owners_lost"] == 1 and stats["active_streams"] == 0
    assert len(await stored_terminals(bus.js, "req-orphan")) == 1


async def test_a_dead_decode_owners_request_taken_over_within_the_grace_continues_to_one_finished(
        bus, codec_model_dir, codec_decoder):
    codes = random_codes(12, codec_decoder.config.codebook_size, seed=8)
    async with running_vocoder(bus, codec_model_dir):  # the default grace: far longer than this test
        dead = StandInDecode(bus, "req-migrated", replica="decode-died", lease_ttl_s=30.0)
        listener = await Listener.open(bus.nc, "req-migrated")
        await dead.start()
        await dead.chunks(codes[:4], [2, 2])
        await listener.audio_chunks(2)
        await LeaseKeeper(bus.kv, "decode-died", "decode", interval_s=0.1, ttl_s=0.5).renew()  # its last renewal
        await settled_status(bus, "vocoder-test", lambda s: s["requests_awaiting_migration"] == 1)
        # Another decode replica takes it over (epoch 2, fenced on the subject's last sequence) and continues.
        heir = StandInDecode(bus, "req-migrated", replica="decode-heir")
        await heir.lease.renew()
        claim = await claim_request(bus.kv, "req-migrated", heir.replica, current=await read_owner(bus.kv,
                                                                                                  "req-migrated"))
        last = await last_subject_sequence(bus.js, CODES_STREAM, subjects.codes(heir.partition, "req-migrated"))
        heir.publisher = await CodesPublisher.take_over(bus.js, partition=heir.partition, request_id="req-migrated",
                                                        epoch=claim.record.epoch, replica=heir.replica,
                                                        last_sequence=last, resume_frame=4, next_seq=2)
        heir.next_seq, heir.frames = 2, 4
        await heir.chunks(codes[4:], [4, 4])
        await heir.finish()
        terminal = await listener.terminal()
        stats = await settled_status(bus, "vocoder-test", lambda s: s["active_streams"] == 0)

    assert isinstance(terminal, Finished) and (terminal.chunk_count, terminal.frames) == (4, 12)
    assert [chunk.seq for chunk in listener.audio] == [0, 1, 2, 3], "every chunk once, in order"
    streamed, full = pcm_of(listener.audio).astype(np.int32), full_decode_pcm(codec_decoder, codes).astype(np.int32)
    assert streamed.shape == full.shape and np.abs(streamed - full).max() <= 1, "the audio neither splices nor restarts"
    assert stats["decode_owners_lost"] == 0 and stats["requests_awaiting_migration"] == 0
    assert len(await stored_terminals(bus.js, "req-migrated")) == 1


async def test_a_racing_terminal_publisher_loses_to_the_first(bus, codec_model_dir, codec_decoder):
    size = codec_decoder.config.codebook_size
    async with running_vocoder(bus, codec_model_dir):
        # Another stage ends the request first: the vocoder's terminal is refused and it stands down.
        stand_in = StandInDecode(bus, "req-race")
        listener = await Listener.open(bus.nc, "req-race")
        await stand_in.start()
        await stand_in.chunk(random_codes(2, size, seed=6))
        await listener.next_audio()
        timeout = Failed(request_id="req-race", at=time.time(), stage=Stage.GATEWAY, code=ErrorCode.TIMEOUT,
                         reason="the client's deadline passed")
        assert await publish_terminal(bus.js, "req-race", timeout)
        await stand_in.finish()
        # The vocoder ends a request first: a later publisher is refused.
        done_listener, done = await serve_one(bus, "req-race-2", random_codes(4, size, seed=7))
        late = Failed(request_id="req-race-2", at=time.time(), stage=Stage.GATEWAY, code=ErrorCode.TIMEOUT,
                      reason="late")
        late_won = await publish_terminal(bus.js, "req-race-2", late)
        stats = await status(bus, "vocoder-test")

    assert await stored_terminals(bus.js, "req-race") == [timeout], "one terminal: the first publisher's"
    assert stats["terminals_stood_down"] == 1 and stats["active_streams"] == 0
    assert isinstance(done, Finished) and not late_won
    assert await stored_terminals(bus.js, "req-race-2") == [done]


async def test_chunks_of_a_stale_epoch_are_ignored(bus, codec_model_dir, codec_decoder):
    size = codec_decoder.config.codebook_size
    codes, stale = random_codes(8, size, seed=8), random_codes(2, size, seed=9)
    request_id = "req-epochs"
    async with running_vocoder(bus, codec_model_dir):
        first_owner = StandInDecode(bus, request_id, replica="decode-one")
        listener = await Listener.open(bus.nc, request_id)
        await first_owner.start()
        await first_owner.chunks(codes[:4], [2, 2])
        # A second replica takes the request over (epoch 2), fenced on what it read of CODES.
        current = await read_owner(bus.kv, request_id)
        claim = await claim_request(bus.kv, request_id, "decode-two", current=current)
        subject = subjects.codes(first_owner.partition, request_id)
        second = await CodesPublisher.take_over(
            bus.js, partition=first_owner.partition, request_id=request_id, epoch=claim.record.epoch,
            replica="decode-two", last_sequence=await last_subject_sequence(bus.js, CODES_STREAM, subject),
            resume_frame=4, next_seq=2)
        # The old owner, not yet knowing, appends seq 2 without fencing: the vocoder must not voice it.
        stale_chunk = CodesChunk.from_frames(request_id=request_id, seq=2, first_frame=4, epoch=1, frames=stale)
        second.last_sequence = (await bus.js.publish(subject, encode(stale_chunk))).seq  # so that B can go on
        for seq, start in ((2, 4), (3, 6)):
            await second.publish(CodesChunk.from_frames(request_id=request_id, seq=seq, first_frame=start,
                                                        epoch=claim.record.epoch, frames=codes[start:start + 2]))
        first_owner.publisher, first_owner.next_seq, first_owner.frames = second, 4, 8
        await first_owner.finish()
        terminal = await listener.terminal()

    assert isinstance(terminal, Finished) and (terminal.chunk_count, terminal.frames) == (4, 8)
    assert [c.seq for c in listener.audio] == [0, 1, 2, 3]
    full = full_decode_pcm(codec_decoder, codes).astype(np.int32)
    assert np.abs(pcm_of(listener.audio).astype(np.int32) - full).max() <= 1, "the new owner's frames, not the stale"


async def test_requests_beyond_max_streams_wait_and_are_then_served(bus, codec_model_dir, codec_decoder):
    size = codec_decoder.config.codebook_size
    ids = ["req-wait-a", "req-wait-b", "req-wait-c"]
    codes = {rid: random_codes(10, size, seed=20 + n) for n, rid in enumerate(ids)}
    listeners = {rid: await Listener.open(bus.nc, rid) for rid in ids}
    for rid in ids:  # all in CODES before the vocoder starts, so they compete for its one stream
        stand_in = StandInDecode(bus, rid)
        await stand_in.start()
        await stand_in.chunks(codes[rid], [2, 8])
        await stand_in.finish()
    async with running_vocoder(bus, codec_model_dir, replica="vocoder-narrow", max_streams=1):
        terminals = {rid: await listeners[rid].terminal() for rid in ids}
        stats = await status(bus, "vocoder-narrow")

    assert stats["messages_deferred"] > 0, "requests beyond max_streams were put back, not voiced at once"
    for rid in ids:
        assert isinstance(terminals[rid], Finished) and terminals[rid].chunk_count == 2, rid
        full = full_decode_pcm(codec_decoder, codes[rid]).astype(np.int32)
        assert np.abs(pcm_of(listeners[rid].audio).astype(np.int32) - full).max() <= 1, rid
        assert [c.seq for c in listeners[rid].audio] == [0, 1], rid
