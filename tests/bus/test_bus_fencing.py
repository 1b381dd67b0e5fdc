"""Server-enforced exactly-once endings and fencing: terminal guard, stale owners, Msg-Id dedup, CAS claims."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from messages import (CodesChunk, CodesEnd, CodesMessage, ErrorCode, Failed, Finished, Stage, TakeoverMarker,
                      TerminalEvent, decode, encode, subjects)
from messages.streams import CODES_STREAM, EVENTS_STREAM, BusConfig
from services.bus import (CodesPublisher, OwnershipConflict, StaleOwner, claim_partition, claim_request, connect,
                          fenced_publish, last_subject_sequence, publish_terminal, read_owner, still_owner)
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny",), num_partitions=2)


def chunk(seq: int, epoch: int, request_id: str = "req-1") -> CodesChunk:
    frames = np.full((2, 16), seq, dtype=np.int64)
    return CodesChunk.from_frames(request_id=request_id, seq=seq, first_frame=2 * seq, epoch=epoch, frames=frames)


async def subject_messages(js, stream: str, subject: str) -> list:
    """Every message on `subject`, in order, decoded (an ordered consumer over the stream)."""
    count = (await js.stream_info(stream, subjects_filter=subject)).state.subjects or {}
    sub = await js.subscribe(subject, ordered_consumer=True)
    found = [await sub.next_msg(5.0) for _ in range(count.get(subject, 0))]
    await sub.unsubscribe()
    return found


async def test_two_stages_racing_to_end_a_request_make_one_terminal(nats_server, nats_client) -> None:
    await fresh_bus(nats_client.jetstream(), CONFIG)
    other = await connect(nats_server.url, "racer-b")
    finished = Finished(request_id="req-1", at=1.0, frames=9, audio_seconds=0.72, chunk_count=3)
    failed = Failed(request_id="req-1", at=1.0, stage=Stage.GATEWAY, code=ErrorCode.TIMEOUT, reason="late")
    results = await asyncio.gather(publish_terminal(nats_client.jetstream(), "req-1", finished),
                                   publish_terminal(other.jetstream(), "req-1", failed))
    await other.close()
    assert sorted(results) == [False, True]
    stored = await subject_messages(nats_client.jetstream(), EVENTS_STREAM, subjects.terminal("req-1"))
    assert len(stored) == 1
    assert decode(stored[0].data, TerminalEvent) == (finished if results[0] else failed)
    assert await publish_terminal(nats_client.jetstream(), "req-1", finished) is False  # later ones too


async def test_a_retry_of_a_landed_publish_counts_as_done(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    subject, payload = subjects.terminal("req-2"), b"x"
    first = await fenced_publish(js, subject, payload, stream=EVENTS_STREAM, expected=0, msg_id="mine")
    retry = await fenced_publish(js, subject, payload, stream=EVENTS_STREAM, expected=0, msg_id="mine")
    theirs = await fenced_publish(js, subject, payload, stream=EVENTS_STREAM, expected=0, msg_id="theirs")
    assert first.seq == retry.seq and retry.duplicate and theirs is None
    assert len(await subject_messages(js, EVENTS_STREAM, subject)) == 1


async def test_msg_id_duplicates_are_dropped(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    publisher = CodesPublisher(js, partition=1, request_id="req-1", epoch=1)
    first = await publisher.publish(chunk(0, 1))
    again = await publisher.publish(chunk(0, 1))  # a plain retry of the same chunk
    assert first == again
    raw = [await js.publish(subjects.codes(0, "req-9"), b"r", headers={"Nats-Msg-Id": "same"}) for _ in range(2)]
    assert raw[1].duplicate and raw[0].seq == raw[1].seq
    assert len(await subject_messages(js, CODES_STREAM, subjects.codes(1, "req-1"))) == 1


async def test_a_stale_owner_is_refused_after_a_takeover(nats_client) -> None:
    js = nats_client.jetstream()
    kv = await fresh_bus(js, CONFIG)
    claim_a = await claim_request(kv, "req-1", "decode-a")
    stale = CodesPublisher(js, partition=0, request_id="req-1", epoch=claim_a.record.epoch)
    await stale.publish(chunk(0, 1))
    await stale.publish(chunk(1, 1))

    claim_b = await claim_request(kv, "req-1", "decode-b", current=await read_owner(kv, "req-1"))
    assert claim_b.record.epoch == 2 and not await still_owner(kv, claim_a)
    last = await last_subject_sequence(js, CODES_STREAM, stale.subject)
    owner = await CodesPublisher.take_over(js, partition=0, request_id="req-1", epoch=2, replica="decode-b",
                                           last_sequence=last, resume_frame=4, next_seq=2)
    with pytest.raises(StaleOwner) as caught:
        await stale.publish(chunk(2, 1))
    assert caught.value.code == "stale_owner"
    await owner.publish(chunk(2, 2))
    await owner.publish(CodesEnd(request_id="req-1", seq=3, epoch=2, reason="finished", total_frames=6, stop="eos"))
    stored = [decode(m.data, CodesMessage) for m in await subject_messages(js, CODES_STREAM, stale.subject)]
    assert [(type(m).__name__, m.epoch) for m in stored] == [
        ("CodesChunk", 1), ("CodesChunk", 1), ("TakeoverMarker", 2), ("CodesChunk", 2), ("CodesEnd", 2)]
    assert isinstance(stored[2], TakeoverMarker) and stored[2].replica == "decode-b"


async def test_a_takeover_racing_a_stale_append_is_a_conflict(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    stale = CodesPublisher(js, partition=0, request_id="req-3", epoch=1)
    await stale.publish(chunk(0, 1, "req-3"))
    last = await last_subject_sequence(js, CODES_STREAM, stale.subject)
    await stale.publish(chunk(1, 1, "req-3"))  # lands after the new owner read CODES
    with pytest.raises(OwnershipConflict, match="re-read"):
        await CodesPublisher.take_over(js, partition=0, request_id="req-3", epoch=2, replica="decode-b",
                                       last_sequence=last, resume_frame=2, next_seq=1)


async def test_ownership_claims_are_compare_and_set(nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    outcomes = await asyncio.gather(claim_request(kv, "req-1", "decode-a"), claim_request(kv, "req-1", "decode-b"),
                                    return_exceptions=True)
    winners = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(winners) == 1 and isinstance([o for o in outcomes if o not in winners][0], OwnershipConflict)
    assert (await read_owner(kv, "req-1")).record == winners[0].record
    takeover = await claim_request(kv, "req-1", "decode-c", current=winners[0])
    with pytest.raises(OwnershipConflict):  # a second takeover from the same (now old) view loses
        await claim_request(kv, "req-1", "decode-d", current=winners[0])
    assert takeover.record.epoch == 2 and await still_owner(kv, takeover)


async def test_partition_claims_are_compare_and_set(nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    first = await claim_partition(kv, 1, "vocoder-a")
    with pytest.raises(OwnershipConflict):
        await claim_partition(kv, 1, "vocoder-b")
    second = await claim_partition(kv, 1, "vocoder-b", current=first)
    assert (second.record.replica, second.record.epoch) == ("vocoder-b", 2)


async def test_codes_publisher_refuses_another_requests_message(nats_client) -> None:
    publisher = CodesPublisher(nats_client.jetstream(), partition=0, request_id="req-1", epoch=1)
    with pytest.raises(ValueError, match="epoch"):
        await publisher.publish(chunk(0, 2))
    assert encode(chunk(0, 1))  # the message itself is fine
