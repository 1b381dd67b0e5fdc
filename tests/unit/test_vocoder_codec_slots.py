"""The vocoder's CodecWorker over the slot decoder: a stream holds a slot until released, a released slot is
reused clean, a released stream's queued work never runs, and a cancelled `new_stream` gives its slot back."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from services.model.codec import load_codec_decoder, slot_decoder
from services.model.codec.primed_voices import PrimedVoices
from services.model.codec.slot_pool import SlotSnapshot, SlotsExhausted
from services.vocoder.codec_worker import CodecWorker, _Job
from services.vocoder.errors import CodecFailure
from services.vocoder.service import CODEC_SUBDIR
from services.vocoder.request_streams import RequestStream, StreamTable
from tests.support.vocoder_stubs import (
    chunk_sizes,
    codec_decoder,  # noqa: F401 (fixture)
    codec_model_dir,  # noqa: F401 (fixture)
    random_codes,
)


@pytest.fixture
async def worker(codec_model_dir):
    codec = await CodecWorker.load(load_codec_decoder, codec_model_dir / CODEC_SUBDIR, "cpu", torch.float32,
                                   max_streams=2, max_batch=4)
    try:
        yield codec
    finally:
        await codec.close()


async def _voice(worker: CodecWorker, stream, codes: np.ndarray) -> np.ndarray:
    pieces, start = [], 0
    for size in chunk_sizes(codes.shape[0]):
        pieces.append(await worker.decode(stream, codes[start:start + size]))
        start += size
    return np.concatenate(pieces)


async def test_streams_decode_in_their_slots_and_a_released_slot_is_reused_clean(worker, codec_decoder):
    codes = [random_codes(13, codec_decoder.config.codebook_size, seed=n) for n in range(3)]
    first, second = await worker.new_stream(), await worker.new_stream()
    assert {first.slot, second.slot} == {0, 1}
    audio = await asyncio.gather(_voice(worker, first, codes[0]), _voice(worker, second, codes[1]))
    for samples, stream_codes in zip(audio, codes):
        full = codec_decoder.decode(torch.from_numpy(stream_codes)).numpy()
        assert np.abs(samples - full).max() <= 1e-5
    with pytest.raises(SlotsExhausted, match="max_streams plus max_redecodes"):
        await worker.new_stream()
    first.release()
    first.release()  # idempotent
    reused = await worker.new_stream()
    assert reused.slot == first.slot
    again = await _voice(worker, reused, codes[2])
    full = codec_decoder.decode(torch.from_numpy(codes[2])).numpy()
    assert np.abs(again - full).max() <= 1e-5, "a reused slot starts from a fresh stream's state"
    with pytest.raises(CodecFailure, match="released"):
        await worker.decode(first, codes[0][:2])


async def test_context_frames_prime_the_stream_and_are_not_voiced(worker, codec_decoder):
    """An in-context clone's reference frames: decoded into the state, their audio dropped, so the rest sounds as
    the tail of a decode of reference + generated frames (and unlike the generated frames decoded alone)."""
    context, codes = (random_codes(n, codec_decoder.config.codebook_size, seed=n) for n in (11, 6))
    stream = await worker.new_stream()
    first = await worker.decode(stream, codes[:2], context)
    rest = await worker.decode(stream, codes[2:])
    full = codec_decoder.decode(torch.from_numpy(np.concatenate([context, codes]))).numpy()
    assert np.abs(np.concatenate([first, rest]) - full[11 * 1920:]).max() <= 1e-5
    alone = codec_decoder.decode(torch.from_numpy(codes)).numpy()
    assert np.abs(first - alone[:2 * 1920]).max() > 1e-3
    stream.release()


async def test_a_reference_is_primed_in_prepared_passes_and_its_state_kept_for_the_next_request(
        worker, codec_decoder, monkeypatch):
    """The first clone of a reference decodes its frames in passes of the prepared lengths (11 = 8 + 2 + 1); the
    next request with the same frames gets a copy of that state, and speaks exactly as the first did."""
    size = codec_decoder.config.codebook_size
    context, codes = random_codes(11, size, seed=21), random_codes(4, size, seed=22)
    forwards = []
    forward = worker.decoder.forward
    monkeypatch.setattr(worker.decoder, "forward", lambda c, rows: forwards.append(c.shape) or forward(c, rows))
    first, second = await worker.new_stream(), await worker.new_stream()
    heard = await worker.decode(first, codes, context)
    assert forwards == [(1, 8, 16), (1, 2, 16), (1, 1, 16), (1, 4, 16)], \
        "the context in passes of the prepared lengths, then the chunk"
    forwards.clear()
    again = await worker.decode(second, codes, context)
    assert forwards == [(1, 4, 16)], "the kept state copied in: no forward over the context"
    np.testing.assert_array_equal(again, heard)
    full = codec_decoder.decode(torch.from_numpy(np.concatenate([context, codes]))).numpy()
    assert np.abs(heard - full[11 * 1920:]).max() <= 1e-5
    assert worker.primed_status() == {"codec_voices_primed": 1, "codec_voices_reused": 1, "codec_voices_kept": 1,
                                      "codec_voices_kept_bytes": worker.primed.num_bytes}
    assert worker.primed.num_bytes == worker.slots.pool.flat[0].numel() * 4 > 0
    assert worker.timings["prime"].count == 2


async def test_a_long_reference_is_primed_in_bounded_forwards_and_the_oldest_kept_state_goes_first(
        codec_model_dir, codec_decoder, monkeypatch):
    monkeypatch.setattr(slot_decoder, "PRIME_PASS_LENGTHS", (4, 2, 1))
    codec = await CodecWorker.load(load_codec_decoder, codec_model_dir / CODEC_SUBDIR, "cpu", torch.float32,
                                   max_streams=1, max_batch=4, primed_voices=1)
    try:
        size = codec_decoder.config.codebook_size
        contexts = [random_codes(10, size, seed=30 + n) for n in range(2)]
        codes = random_codes(3, size, seed=33)
        for context in (contexts[0], contexts[1], contexts[0]):  # the second evicts the first: it is primed again
            stream = await codec.new_stream()
            heard = await codec.decode(stream, codes, context)
            full = codec_decoder.decode(torch.from_numpy(np.concatenate([context, codes]))).numpy()
            assert np.abs(heard - full[10 * 1920:]).max() <= 1e-5, "ten frames primed 4 + 4 + 2"
            stream.release()
        assert (codec.num_voices_primed, codec.num_voices_reused, len(codec.primed)) == (3, 0, 1)
    finally:
        await codec.close()


async def test_a_voice_is_primed_beside_the_other_streams_chunks_and_a_stream_released_meanwhile_ends(
        worker, codec_decoder, monkeypatch):
    """While one stream's reference is being primed (held here on its thread), another stream's chunk is decoded;
    a stream released during its priming gets CodecFailure, and its slot serves the next stream at once."""
    size = codec_decoder.config.codebook_size
    context, codes = random_codes(9, size, seed=41), random_codes(3, size, seed=42)
    entered, go = threading.Event(), threading.Event()
    primed_state = worker.slots.primed_state

    def held(frames):
        entered.set()
        go.wait()
        return primed_state(frames)

    monkeypatch.setattr(worker.slots, "primed_state", held)
    clone, other = await worker.new_stream(), await worker.new_stream()
    loop = asyncio.get_running_loop()
    cloned = loop.create_task(worker.decode(clone, codes, context))
    await loop.run_in_executor(None, entered.wait)
    voiced = await worker.decode(other, codes)  # not behind the priming
    alone = codec_decoder.decode(torch.from_numpy(codes)).numpy()
    assert np.abs(voiced - alone).max() <= 1e-5 and not cloned.done()
    go.set()
    full = codec_decoder.decode(torch.from_numpy(np.concatenate([context, codes]))).numpy()
    assert np.abs(await cloned - full[9 * 1920:]).max() <= 1e-5

    go.clear()
    entered.clear()
    released = loop.create_task(worker.decode(other, codes, random_codes(9, size, seed=43)))
    await loop.run_in_executor(None, entered.wait)
    other.release()
    successor = await worker.new_stream()  # the slot is free while the priming still runs: it never writes a slot
    assert successor.slot == other.slot
    go.set()
    with pytest.raises(CodecFailure, match="released"):
        await released
    assert np.abs(await worker.decode(successor, codes) - alone).max() <= 1e-5, "a clean slot"


async def test_a_first_chunk_is_voiced_before_the_later_passes_of_its_call(worker, codec_decoder, monkeypatch):
    """One call with a 2-frame first chunk of one stream and two 8-frame chunks of another (two rounds: the other
    stream's second chunk waits for its first): the short chunk shares the first round's pass, and its audio is
    handed back while the second round's pass is still running (held here), not when the whole call ends."""
    size = codec_decoder.config.codebook_size
    short, long = random_codes(2, size, seed=51), random_codes(16, size, seed=52)
    entered, go = threading.Event(), threading.Event()
    run_pass = worker.slots._run_pass
    passes: list[list[int]] = []

    def held(slots, chunks, to_host):
        passes.append([chunk.shape[0] for chunk in chunks])
        if len(passes) == 2:
            entered.set()
            go.wait()
        return run_pass(slots, chunks, to_host)

    monkeypatch.setattr(worker.slots, "_run_pass", held)
    first, other = await worker.new_stream(), await worker.new_stream()
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    jobs = [_Job(other, long[:8], None, futures[0]), _Job(first, short, None, futures[1]),
            _Job(other, long[8:], None, futures[2])]
    call = loop.create_task(worker._run_batch(jobs))
    voiced = await asyncio.wait_for(futures[1], 60)  # while the second round's pass is held (or about to be)
    assert not futures[2].done() and not call.done()
    await loop.run_in_executor(None, entered.wait)
    go.set()
    await call
    assert worker.num_calls == 1 and passes == [[2, 8], [8]], "one pass a round: the 2-frame chunk rides padded"
    alone = codec_decoder.decode(torch.from_numpy(short)).numpy()
    assert np.abs(voiced - alone).max() <= 1e-5
    other_audio = np.concatenate([futures[0].result(), futures[2].result()])
    assert np.abs(other_audio - codec_decoder.decode(torch.from_numpy(long)).numpy()).max() <= 1e-5


def test_primed_voices_are_keyed_by_the_frames_content_and_shape():
    frames = random_codes(6, 2048, seed=1)
    key = PrimedVoices.key(frames)
    assert PrimedVoices.key(frames.astype(np.int32)) == key, "the dtype the frames came in does not matter"
    changed = frames.copy()
    changed[5, 15] += 1
    assert PrimedVoices.key(changed) != key
    assert PrimedVoices.key(frames.reshape(12, 8)) != key
    kept = PrimedVoices(0)
    kept.put(key, None)
    assert len(kept) == 0 and kept.get(key) is None, "capacity 0 keeps nothing"
    one = PrimedVoices(1)
    small, large = (SlotSnapshot(torch.zeros(n), torch.zeros((), dtype=torch.long)) for n in (3, 5))
    one.put(key, small)
    one.put(key, small)  # the same voice again: counted once
    assert (len(one), one.num_bytes) == (1, 12)
    one.put(PrimedVoices.key(changed), large)  # the older goes
    assert (len(one), one.num_bytes, one.get(key)) == (1, 20, None)
    with pytest.raises(ValueError):
        PrimedVoices(-1)


async def test_queued_work_of_a_released_stream_is_dropped(worker, codec_decoder):
    live, ended = await worker.new_stream(), await worker.new_stream()
    codes = random_codes(2, codec_decoder.config.codebook_size, seed=7)
    loop = asyncio.get_running_loop()
    jobs = [_Job(live, codes, None, loop.create_future()), _Job(ended, codes, None, loop.create_future())]
    ended.release()  # after the jobs were queued, before the batcher handed them to the thread
    await worker._run_batch(jobs)
    assert jobs[0].done.result().shape == (2 * worker.samples_per_frame,)
    with pytest.raises(CodecFailure, match="released"):
        jobs[1].done.result()
    frames = await worker.run_on_thread(worker.slots.pool.num_frames, live.slot)
    assert frames == 2 and worker.num_calls == 1


async def test_a_cancelled_new_stream_gives_its_slot_back(worker):
    entered, go = threading.Event(), threading.Event()
    acquire = worker.slots.acquire

    def held_acquire() -> int:
        entered.set()
        go.wait()
        return acquire()

    worker.slots.acquire = held_acquire
    task = asyncio.get_running_loop().create_task(worker.new_stream())
    await asyncio.get_running_loop().run_in_executor(None, entered.wait)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    go.set()
    worker.slots.acquire = acquire
    # The slot is taken, then (its taker gone) handed back on the codec thread before anything queued after it.
    await worker.run_on_thread(lambda: None)
    assert await worker.run_on_thread(lambda: worker.slots.pool.num_free) == 2


def test_the_stream_table_releases_a_stream_s_codec_slot():
    released = []

    class Slot:
        def release(self) -> None:
            released.append(self)

    table = StreamTable(2)
    slot = Slot()
    table.add(RequestStream("a", 0, codec_state=slot))
    table.add(RequestStream("b", 0, codec_state=None))
    table.release("a", ended=False)
    table.release("b", ended=True)
    assert released == [slot]


@pytest.fixture
async def patient_worker(codec_model_dir, monkeypatch):
    """A worker whose chunks with audio in hand may wait a minute: only company, never the clock, ends a wait here.
    Its `calls` lists each call's chunk count, taken as the call reaches the codec thread."""
    codec = await CodecWorker.load(load_codec_decoder, codec_model_dir / CODEC_SUBDIR, "cpu", torch.float32,
                                   max_streams=4, max_batch=3, max_hold_s=60.0)
    codec.calls = []
    decode_on_thread = codec._decode_on_thread

    def counted(slots, *args):
        codec.calls.append(len(slots))
        return decode_on_thread(slots, *args)

    monkeypatch.setattr(codec, "_decode_on_thread", counted)
    try:
        yield codec
    finally:
        await codec.close()


async def test_chunks_with_audio_in_hand_wait_for_a_first_chunk_and_go_in_its_call(patient_worker, codec_decoder):
    size = codec_decoder.config.codebook_size
    codes = [random_codes(4, size, seed=60 + n) for n in range(3)]
    streams = [await patient_worker.new_stream() for _ in range(3)]
    waiting = [asyncio.ensure_future(patient_worker.decode(stream, c, audio_in_hand_s=2.0))
               for stream, c in zip(streams[:2], codes[:2])]
    first = await asyncio.wait_for(patient_worker.decode(streams[2], codes[2]), 30)  # in hand: none
    voiced = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert patient_worker.calls == [3], "the waiting chunks went in the first chunk's call"
    for samples, stream_codes in zip([*voiced, first], codes):
        assert np.abs(samples - codec_decoder.decode(torch.from_numpy(stream_codes)).numpy()).max() <= 1e-5


async def test_a_full_call_ends_the_wait(patient_worker, codec_decoder):
    size = codec_decoder.config.codebook_size
    streams = [await patient_worker.new_stream() for _ in range(3)]
    voiced = await asyncio.wait_for(asyncio.gather(*[
        patient_worker.decode(stream, random_codes(2, size, seed=70 + n), audio_in_hand_s=2.0)
        for n, stream in enumerate(streams)]), 30)  # max_batch 3: the third fills the call
    assert patient_worker.calls == [3] and all(v.shape == (2 * patient_worker.samples_per_frame,) for v in voiced)


async def test_a_chunk_without_enough_audio_in_hand_does_not_wait(patient_worker, codec_decoder):
    stream = await patient_worker.new_stream()
    codes = random_codes(2, codec_decoder.config.codebook_size, seed=80)
    from services.vocoder.codec_worker import HOLD_MARGIN_S

    await asyncio.wait_for(patient_worker.decode(stream, codes, audio_in_hand_s=HOLD_MARGIN_S), 30)
    assert patient_worker.calls == [1]


def test_a_worker_that_decodes_each_chunk_alone_holds_none(codec_decoder):
    slots = slot_decoder.SlotDecoder(codec_decoder, max_streams=1, max_rows=1)
    assert CodecWorker(slots, batch_across_requests=False, max_hold_s=1.0).max_hold_s == 0.0
    with pytest.raises(ValueError, match="max_hold_s"):
        CodecWorker(slots, max_hold_s=-1.0)


async def test_the_audio_in_hand_is_what_was_voiced_less_what_has_played_since_the_first_audio():
    from services.vocoder.handler import CodesHandler

    class Codec:  # only what the handler reads: 80-ms frames
        sample_rate, samples_per_frame = 24000, 1920

    handler = CodesHandler(None, StreamTable(4), Codec(), None, None)
    stream = RequestStream("req", 0, codec_state=None)
    stream.frames = 25  # two seconds voiced
    assert handler._audio_in_hand_s(stream) == 0.0, "before its first audio went out, a stream has none in hand"
    now = asyncio.get_running_loop().time()
    stream.audio_started_at = now - 0.5
    assert 1.4 <= handler._audio_in_hand_s(stream) <= 1.5  # two seconds voiced, half a second played


@pytest.mark.parametrize("urgent_passes", [False, True])
async def test_with_urgent_passes_a_first_chunk_gets_a_pass_of_its_own_first(codec_model_dir, codec_decoder,
                                                                            urgent_passes):
    """Two 8-frame chunks with audio in hand wait for company; a one-frame first chunk ends the wait and the three go
    in one call. Planned by cost alone they share one padded pass; with `urgent_passes` the first chunk runs alone,
    first (its listener has nothing in hand). Either way each is its stream's full decode."""
    codec = await CodecWorker.load(load_codec_decoder, codec_model_dir / CODEC_SUBDIR, "cpu", torch.float32,
                                   max_streams=3, max_batch=3, max_hold_s=60.0, urgent_passes=urgent_passes)
    passes: list[list[int]] = []
    run_pass = codec.slots._run_pass

    def recorded(slots, chunks, to_host):
        passes.append([chunk.shape[0] for chunk in chunks])
        return run_pass(slots, chunks, to_host)

    codec.slots._run_pass = recorded
    try:
        size = codec_decoder.config.codebook_size
        codes = [random_codes(8, size, seed=90), random_codes(8, size, seed=91), random_codes(1, size, seed=92)]
        streams = [await codec.new_stream() for _ in codes]
        waiting = [asyncio.ensure_future(codec.decode(stream, c, audio_in_hand_s=2.0))
                   for stream, c in zip(streams[:2], codes[:2])]
        first = await asyncio.wait_for(codec.decode(streams[2], codes[2]), 30)
        voiced = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    finally:
        await codec.close()
    assert codec.num_calls == 1
    assert passes == ([[1], [8, 8]] if urgent_passes else [[1, 8, 8]])
    for samples, stream_codes in zip([*voiced, first], codes):
        assert np.abs(samples - codec_decoder.decode(torch.from_numpy(stream_codes)).numpy()).max() <= 1e-5
