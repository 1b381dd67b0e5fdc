"""The decode service against a real nats-server and the real tiny model: batching, bad input, cancel."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest

from messages import decode as decode_message
from messages import subjects
from messages.events import Failed
from messages.errors import ErrorCode, Stage
from messages.frames import CodesEnd
from messages.records import CancelRecord
from messages.streams import CODES_STREAM
from services.bus.claims import claim_request, read_owner
from services.bus.codes_publisher import CodesPublisher
from services.bus.fencing import last_subject_sequence
from services.bus.kvstore import cancel_request
from services.bus.leases import is_alive
from services.decode.codes_stream import ChunkRule
from tests.support.decode_stubs import (
    NUM_PARTITIONS,
    REPLICA,
    Oracle,
    running_decode,
    synthesis,
    takeover_then,
)

TEXTS = ["hello the voice", "speak and the voice", "the hello", "and speak hello the voice and"]


@pytest.mark.parametrize("steps_queued", [1, 2])
async def test_staggered_greedy_requests_share_batches_and_match_the_offline_oracle(nats_server, tiny_checkpoint,
                                                                                     steps_queued):
    requests = [synthesis(f"stagger-{n}", text, frames=20 + 3 * n) for n, text in enumerate(TEXTS)]
    async with running_decode(nats_server.url, tiny_checkpoint, steps_queued=steps_queued) as decode:
        for request in requests:  # each joins while the ones before it are decoding
            await decode.submit(request)
            await decode.log.first_chunk(request.id)
        ends = [await decode.log.end(request.id) for request in requests]
        stats = await decode.idle_stats()
    oracle = Oracle(tiny_checkpoint)
    for request, end in zip(requests, ends):
        expected = oracle.codes(request)
        np.testing.assert_array_equal(decode.log.frames(request.id), expected, err_msg=request.id)
        assert end.reason == "finished" and end.total_frames == len(expected)
        assert end.stop == ("length" if len(expected) == request.max_new_tokens else "eos")
        assert end.usage.output_frames == len(expected) and end.usage.prompt_tokens > end.usage.input_tokens > 0
        marker, _ = takeover_then(decode.log, request.id)
        assert (marker.epoch, marker.resume_frame, marker.next_seq) == (1, 0, 0)
        sizes = decode.log.chunk_sizes(request.id)
        # Fewer than 32 requests run (--one-frame-first-chunk-below's default): every first chunk is one frame.
        rule = [ChunkRule(1, 8).size(seq) for seq in range(len(sizes))]
        assert sizes[:-1] == rule[:-1] and 0 < sizes[-1] <= rule[-1]
        assert end.seq == len(sizes)
        assert decode.log.kinds(request.id)[:2] == ["Started", "FirstFrame"]
    assert stats["max_batch_size"] > 1, stats
    assert stats["requests_finished"] == len(requests)
    assert stats["kv_blocks_in_use"] == 0 and stats["active_sequences"] == 0


async def test_an_undecodable_request_is_termed_and_the_next_is_served(nats_server, tiny_checkpoint):
    good = synthesis("after-garbage", "hello the voice", frames=6)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await decode.js.publish(subjects.request("tiny"), b"\xc1 not msgpack")
        await decode.submit(good)
        end = await decode.log.end(good.id)
        stats = await decode.idle_stats()
        consumer = await decode.js.consumer_info("REQUESTS", "decode-tiny")
    assert end.reason == "finished"
    assert stats["messages_termed"] == 1
    assert consumer.num_pending == 0 and consumer.num_ack_pending == 0  # termed: gone, never redelivered


async def test_a_request_decode_cannot_read_but_can_name_ends_with_one_terminal_saying_why(nats_server,
                                                                                          tiny_checkpoint):
    good = synthesis("after-refused", "hello the voice", frames=6)
    other_version = {"type": "synthesis_request", "schema": 9, "id": "req-from-the-future", "model": "tiny",
                     "text": "Hi."}
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await decode.js.publish(subjects.request("tiny"), msgspec.msgpack.encode(other_version))
        await decode.submit(good)  # served after the refused one: the intake went on
        end = await decode.log.end(good.id)
        terminals = await decode.js.subscribe(subjects.terminal("req-from-the-future"), stream="EVENTS",
                                              ordered_consumer=True)
        refused = decode_message((await terminals.next_msg(timeout=30)).data, Failed)
        stats = await decode.settled_stats(lambda s: s["failures_by_code"] == {"unsupported_version": 1})
        info = await decode.js.stream_info("EVENTS", subjects_filter=subjects.terminal("req-from-the-future"))
    assert end.reason == "finished"
    assert (refused.code, refused.stage) == (ErrorCode.UNSUPPORTED_VERSION, Stage.DECODE)
    assert info.state.subjects == {subjects.terminal("req-from-the-future"): 1}
    assert stats["messages_termed"] == 1 and stats["failures_by_code"] == {"unsupported_version": 1}


async def test_an_unknown_speaker_ends_with_invalid_request(nats_server, tiny_checkpoint):
    bad = synthesis("no-such-voice", "hello the voice", frames=6, speaker="nobody")
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await decode.submit(bad)
        end = await decode.log.end(bad.id)
    _, last = takeover_then(decode.log, bad.id)
    assert last == end
    assert end.reason == "failed" and end.error.code == ErrorCode.INVALID_REQUEST
    assert end.error.stage == Stage.DECODE and "nobody" in end.error.message
    assert end.total_frames == 0 and end.seq == 0


async def test_a_request_for_a_model_this_replica_does_not_serve_ends_with_unknown_model(nats_server,
                                                                                        tiny_checkpoint):
    # On the tiny model's subject, as only something other than a tiny gateway would put it there.
    other = synthesis("for-another-model", "hello the voice", frames=6, model="qwen3-tts-1_7b")
    same_after_slugging = synthesis("for-TINY", "hello the voice", frames=6, model="TINY")
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await decode.submit(other)
        await decode.submit(same_after_slugging)
        refused = await decode.log.end(other.id)
        served = await decode.log.end(same_after_slugging.id)
        stats = await decode.idle_stats()
    assert refused.reason == "failed" and (refused.error.code, refused.error.stage) == (ErrorCode.UNKNOWN_MODEL,
                                                                                        Stage.DECODE)
    assert "'qwen3-tts-1_7b'" in refused.error.message and refused.total_frames == 0
    assert served.reason == "finished"
    assert stats["failures_by_code"] == {"unknown_model": 1} and stats["requests_finished"] == 1


@pytest.mark.parametrize("steps_queued", [1, 2])
async def test_a_cancel_ends_the_request_with_cancelled_and_frees_its_blocks(nats_server, tiny_checkpoint,
                                                                              steps_queued):
    long = synthesis("to-cancel", "speak and the voice", frames=1000)  # greedy, no EOS before 1000 frames
    async with running_decode(nats_server.url, tiny_checkpoint, runaway_min_frames=1000,
                              steps_queued=steps_queued) as decode:
        await decode.submit(long)
        await decode.log.first_chunk(long.id)
        await cancel_request(decode.kv, CancelRecord(request_id=long.id, reason="the client went away"))
        end = await decode.log.end(long.id)
        stats = await decode.settled_stats(lambda s: s["requests_cancelled"] == 1 and s["active_sequences"] == 0)
    assert isinstance(end, CodesEnd) and end.reason == "failed"
    assert end.error.code == ErrorCode.CANCELLED and end.error.stage == Stage.GATEWAY
    assert end.error.message == "the client went away"
    assert 0 < end.total_frames < 1000 and end.total_frames == len(decode.log.frames(long.id))
    assert stats["requests_cancelled"] == 1 and stats["kv_blocks_in_use"] == 0 and stats["active_sequences"] == 0


async def test_a_request_cancelled_while_it_was_queued_ends_without_a_frame(nats_server, tiny_checkpoint):
    """The client left while the request waited on REQUESTS: decode claims it, finds the cancel and ends it there,
    before the engine ever sees it; the request behind it is served."""
    gone, after = synthesis("cancelled-queued", "the hello", frames=12), synthesis("after-cancel", "the hello", frames=4)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await cancel_request(decode.kv, CancelRecord(request_id=gone.id, reason="left in the queue"))
        await decode.submit(gone)
        end = await decode.log.end(gone.id)
        await decode.submit(after)
        assert (await decode.log.end(after.id)).reason == "finished"
        stats = await decode.idle_stats()
    assert end.reason == "failed" and (end.error.code, end.error.message) == (ErrorCode.CANCELLED, "left in the queue")
    assert end.total_frames == 0 and decode.log.frames(gone.id).shape[0] == 0
    assert decode.log.kinds(gone.id) == ["Started"], "announced as taken, then ended: no frame, no FirstFrame"
    assert stats["requests_cancelled"] == 1 and stats["requests_finished"] == 1


async def test_a_newer_owner_fences_this_replica_out_and_it_stands_down_without_an_end(nats_server, tiny_checkpoint):
    long = synthesis("taken-over", "speak and the voice", frames=1000)
    follow = synthesis("after-takeover", "speak and the voice", frames=20)
    async with running_decode(nats_server.url, tiny_checkpoint, runaway_min_frames=1000) as decode:
        assert await is_alive(decode.kv, REPLICA)  # the lease is renewed while it serves
        await decode.submit(long)
        await decode.log.first_chunk(long.id)
        # Another replica takes the request over (epoch 2), fenced on the subject's last sequence.
        partition = subjects.partition_for(long.id, NUM_PARTITIONS)
        await claim_request(decode.kv, long.id, "decode-other", current=await read_owner(decode.kv, long.id))
        last = await last_subject_sequence(decode.js, CODES_STREAM, subjects.codes(partition, long.id))
        await CodesPublisher.take_over(decode.js, partition=partition, request_id=long.id, epoch=2,
                                       replica="decode-other", last_sequence=last, resume_frame=2, next_seq=1)
        # `long` publishes its next chunk (refused) within 8 frames; `follow` runs beside it for 20.
        await decode.submit(follow)
        follow_end = await decode.log.end(follow.id)
        stats = await decode.idle_stats()
    assert follow_end.reason == "finished"  # the replica serves on
    assert [type(m).__name__ for m in decode.log.codes[long.id]] == ["TakeoverMarker", "CodesChunk", "TakeoverMarker"]
    assert decode.log.codes[long.id][-1].epoch == 2  # nothing of epoch 1 after the takeover; the new owner ends it
    assert stats["requests_stood_down"] == 1 and stats["requests_finished"] == 1
    assert stats["kv_blocks_in_use"] == 0 and stats["active_sequences"] == 0 and stats["active_requests"] == 0


async def test_requests_are_pulled_only_while_there_are_free_sequence_slots(nats_server, tiny_checkpoint):
    a, b, c = [synthesis(f"slot-{n}", "speak and the voice", frames=1000) for n in range(3)]
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=2, runaway_min_frames=1000) as decode:
        for request in (a, b, c):
            await decode.submit(request)
        await decode.log.first_chunk(a.id)
        await decode.log.first_chunk(b.id)
        waiting = await decode.js.consumer_info("REQUESTS", "decode-tiny")
        full = await decode.stats()
        freed_at = time.time()
        await cancel_request(decode.kv, CancelRecord(request_id=a.id))
        await decode.log.first_chunk(c.id)  # a's slot went to c
        for request in (b, c):
            await cancel_request(decode.kv, CancelRecord(request_id=request.id))
        ends = [await decode.log.end(request.id) for request in (a, b, c)]
    assert (waiting.num_pending, waiting.num_ack_pending) == (1, 0)  # c stayed in the stream, not in decode
    assert full["active_requests"] == 2
    started = decode.log.events[c.id][0]
    assert type(started).__name__ == "Started" and started.at >= freed_at  # pulled once a slot was free
    assert [end.error.code for end in ends] == [ErrorCode.CANCELLED] * 3
