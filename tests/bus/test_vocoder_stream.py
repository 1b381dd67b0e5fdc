"""The vocoder service end to end on a real nats-server with a real tiny codec: codes in, PCM and one terminal out."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from messages import decode, encode, subjects
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.events import Failed, Finished, FirstAudio
from messages.requests import RedecodeReply, RedecodeRequest
from messages.streams import EVENTS_STREAM
from services.vocoder.service import status_subject
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
    stored_terminals,
)


async def test_audio_equals_full_decode_and_one_finished_terminal(bus, codec_model_dir, codec_decoder):
    codes = random_codes(19, codec_decoder.config.codebook_size, seed=1)
    sizes = chunk_sizes(19)  # 2, 8, 8, 1
    async with running_vocoder(bus, codec_model_dir):
        decode_replica = StandInDecode(bus, "req-finish")
        listener = await Listener.open(bus.nc, "req-finish")
        await decode_replica.start()
        await decode_replica.chunks(codes, sizes)
        await decode_replica.finish(stop="eos")
        terminal = await listener.terminal()

    assert isinstance(terminal, Finished)
    assert (terminal.frames, terminal.chunk_count, terminal.stop) == (19, len(sizes), "eos")
    assert terminal.audio_seconds == 19 * SAMPLES_PER_FRAME / SAMPLE_RATE
    assert terminal.usage.output_frames == 19
    assert [c.seq for c in listener.audio] == list(range(len(sizes))), "one chunk per codes chunk, in order"
    first_frames = np.cumsum([0, *sizes[:-1]])
    assert [c.first_sample for c in listener.audio] == [int(f) * SAMPLES_PER_FRAME for f in first_frames]
    assert [c.num_samples for c in listener.audio] == [s * SAMPLES_PER_FRAME for s in sizes]
    streamed, full = pcm_of(listener.audio).astype(np.int32), full_decode_pcm(codec_decoder, codes).astype(np.int32)
    assert np.abs(streamed).max() > 1000, "the tiny codec must be audible, or equality proves nothing"
    assert np.abs(streamed - full).max() <= 1, "streamed audio must equal a full decode within int16 rounding"
    assert len(await stored_terminals(bus.js, "req-finish")) == 1
    first_audio = await bus.js.get_last_msg(EVENTS_STREAM, subjects.event("req-finish", FirstAudio.KIND))
    assert decode(first_audio.data, FirstAudio).replica == "vocoder-test"


async def test_failed_codes_end_gives_the_audio_so_far_then_one_failed_terminal(bus, codec_model_dir, codec_decoder):
    codes = random_codes(10, codec_decoder.config.codebook_size, seed=2)
    error = ErrorInfo(code=ErrorCode.PREEMPTED, stage=Stage.DECODE,
                      message="KV pool exhausted; output truncated: give decode more KV memory")
    async with running_vocoder(bus, codec_model_dir):
        decode_replica = StandInDecode(bus, "req-fail")
        listener = await Listener.open(bus.nc, "req-fail")
        await decode_replica.start()
        await decode_replica.chunks(codes, [2, 8])
        await decode_replica.fail(error)
        terminal = await listener.terminal()

    assert isinstance(terminal, Failed)
    assert (terminal.stage, terminal.code, terminal.reason) == (Stage.DECODE, ErrorCode.PREEMPTED, error.message)
    assert (terminal.frames, terminal.chunk_count) == (10, 2)
    assert [c.seq for c in listener.audio] == [0, 1], "both chunks arrived before the terminal"
    full = full_decode_pcm(codec_decoder, codes).astype(np.int32)
    assert np.abs(pcm_of(listener.audio).astype(np.int32) - full).max() <= 1
    assert len(await stored_terminals(bus.js, "req-fail")) == 1


async def test_redecode_from_a_sequence_republishes_identical_bytes(bus, codec_model_dir, codec_decoder):
    codes = random_codes(19, codec_decoder.config.codebook_size, seed=3)
    request_id = "req-redecode"
    partition = subjects.partition_for(request_id, NUM_PARTITIONS)
    async with running_vocoder(bus, codec_model_dir):
        decode_replica = StandInDecode(bus, request_id)
        listener = await Listener.open(bus.nc, request_id)
        await decode_replica.start()
        await decode_replica.chunks(codes, chunk_sizes(19))
        await decode_replica.finish()
        await listener.terminal()
        first_time = {c.seq: c for c in listener.audio}

        reply = await bus.nc.request(subjects.redecode(partition),
                                     encode(RedecodeRequest(request_id=request_id, from_seq=1)), timeout=WAIT_S)
        assert decode(reply.data, RedecodeReply).accepted
        again = await listener.audio_chunks(3)

        other = await bus.nc.request(subjects.redecode(1 - partition),
                                     encode(RedecodeRequest(request_id=request_id)), timeout=WAIT_S)
        refused = decode(other.data, RedecodeReply)

    assert [c.seq for c in again] == [1, 2, 3], "from from_seq on, nothing earlier"
    for chunk in again:
        assert encode(chunk) == encode(first_time[chunk.seq]), f"chunk {chunk.seq} differs from the first time"
    assert not refused.accepted and f"partition {partition}" in refused.reason
    assert len(await stored_terminals(bus.js, request_id)) == 1, "a re-decode publishes no second terminal"


async def test_context_frames_prime_the_live_stream_and_its_redecode(bus, codec_model_dir, codec_decoder):
    """An in-context clone: chunk 0 carries the reference frames, whose audio is not voiced; the audio is the tail of
    a full decode of reference + generated frames, and a re-decode from CODES primes its fresh state the same way."""
    size = codec_decoder.config.codebook_size
    context, codes = random_codes(9, size, seed=4), random_codes(12, size, seed=5)
    request_id = "req-context"
    async with running_vocoder(bus, codec_model_dir):
        decode_replica = StandInDecode(bus, request_id)
        listener = await Listener.open(bus.nc, request_id)
        await decode_replica.start()
        await decode_replica.chunks(codes, [2, 2, 8], context=context)
        await decode_replica.finish()
        terminal = await listener.terminal()
        first_time = {c.seq: c for c in listener.audio}
        reply = await bus.nc.request(subjects.redecode(subjects.partition_for(request_id, NUM_PARTITIONS)),
                                     encode(RedecodeRequest(request_id=request_id, from_seq=1)), timeout=WAIT_S)
        assert decode(reply.data, RedecodeReply).accepted
        again = await listener.audio_chunks(2)

    assert (terminal.frames, terminal.chunk_count) == (12, 3) and listener.audio[0].first_sample == 0
    full = full_decode_pcm(codec_decoder, np.concatenate([context, codes])).astype(np.int32)
    streamed = pcm_of(listener.audio[:3]).astype(np.int32)
    assert np.abs(streamed - full[9 * SAMPLES_PER_FRAME:]).max() <= 1
    alone = full_decode_pcm(codec_decoder, codes).astype(np.int32)
    assert np.abs(streamed - alone).max() > 100, "the context must change the audio, or equality proves nothing"
    for chunk in again:
        assert encode(chunk) == encode(first_time[chunk.seq]), f"re-decoded chunk {chunk.seq} differs"


@pytest.mark.parametrize("urgent_passes", [False, True])
async def test_concurrent_requests_are_decoded_in_shared_codec_batches(bus, codec_model_dir, codec_decoder,
                                                                        urgent_passes):
    """Also with `--codec-urgent-passes`, where the first call's chunks are all first chunks (all urgent)."""
    ids = [f"req-batch-{n}" for n in range(4)]
    codes = {rid: random_codes(18, codec_decoder.config.codebook_size, seed=10 + n) for n, rid in enumerate(ids)}
    listeners = [await Listener.open(bus.nc, rid) for rid in ids]
    for rid in ids:  # all codes wait in CODES before the vocoder starts: its first fetch holds every request
        stand_in = StandInDecode(bus, rid)
        await stand_in.start()
        await stand_in.chunks(codes[rid], chunk_sizes(18))
        await stand_in.finish()
    async with running_vocoder(bus, codec_model_dir, replica="vocoder-batch", codec_urgent_passes=urgent_passes):
        terminals = [await listener.terminal() for listener in listeners]
        reply = await bus.nc.request(status_subject("vocoder-batch"), b"", timeout=WAIT_S)
        stats = json.loads(reply.data)

    assert stats["max_codec_batch"] > 1, "chunks of different requests must share codec calls"
    assert stats["codec_calls"] < stats["audio_chunks"]
    # 4 requests x 18 frames; chunks of different lengths share passes, so a call runs at least one and padding
    # never makes a pass decode less than it ran
    assert stats["codec_passes"] >= stats["codec_calls"] and stats["codec_row_frames"] == 4 * 18, stats
    assert stats["codec_padded_row_frames"] >= stats["codec_row_frames"], stats
    # Every call and every chunk timed. No order between the two is asserted: a chunk is settled as soon as its own
    # pass ends, so a chunk that did not queue can take less than its call, which returns after its last pass.
    timed = stats["codec_seconds"]
    assert timed["call"]["count"] == stats["codec_calls"] and timed["chunk"]["count"] == stats["audio_chunks"], timed
    assert timed["chunk"]["max_ms"] > 0 and timed["call"]["max_ms"] > 0, timed
    for rid, listener, terminal in zip(ids, listeners, terminals):
        assert isinstance(terminal, Finished) and terminal.chunk_count == 3
        full = full_decode_pcm(codec_decoder, codes[rid]).astype(np.int32)
        assert np.abs(pcm_of(listener.audio).astype(np.int32) - full).max() <= 1, rid


async def test_a_codes_message_the_vocoder_cannot_read_ends_its_request_with_one_failed_terminal(
        bus, codec_model_dir, codec_decoder):
    codes = random_codes(2, codec_decoder.config.codebook_size, seed=5)
    async with running_vocoder(bus, codec_model_dir):
        decode_replica = StandInDecode(bus, "req-unreadable")
        listener = await Listener.open(bus.nc, "req-unreadable")
        await decode_replica.start()
        await decode_replica.chunks(codes, [2])
        # A chunk from a decode of another schema version: its envelope still names the request.
        await bus.js.publish(subjects.codes(decode_replica.partition, "req-unreadable"),
                             msgspec.msgpack.encode(["codes", 9, "req-unreadable", 1, 1, b"\x00"]))
        terminal = await listener.terminal()
        stats = await settled_status(bus, "vocoder-test", lambda s: s["active_streams"] == 0)
    assert isinstance(terminal, Failed)
    assert (terminal.stage, terminal.code, terminal.chunk_count) == (Stage.VOCODER, ErrorCode.UNSUPPORTED_VERSION, 1)
    assert [c.seq for c in listener.audio] == [0], "the audio made before the unreadable message arrived first"
    assert len(await stored_terminals(bus.js, "req-unreadable")) == 1
    assert stats["active_streams"] == 0, "the request's codec state is released"
