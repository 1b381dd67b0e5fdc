"""The slot decoder (states in fixed slots, padded fixed-shape steps) on the CPU, eagerly, as CI runs it; on CUDA
the same steps as graphs, when a GPU is present.

Same windowed decoder as test_codec_streaming.py (sliding window 4, 3 layers): lost or leaked context shows up.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from services.model.codec import CodecDecoder, CodecInputError, load_codec_decoder
from services.model.codec.slot_decoder import PRIME_PASS_LENGTHS, SlotDecoder, priming_passes
from services.model.codec.slot_pool import SlotsExhausted
from tests.support.codec_reference import WINDOWED_DECODER, random_codes, save_reference_tokenizer
from tests.support.ragged_streams import decode_ragged, ragged_schedules

TOLERANCE = 1e-5  # test_codec_streaming.py's: streaming vs full decode in float32
CODEBOOK_SIZE = WINDOWED_DECODER["codebook_size"]
DECODE_SCHEDULE = [2, 2, 4, 8, 8, 8, 3]  # decode's chunking: 2, 2, 4, then 8s, the last chunk shorter


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("codec_slots")
    save_reference_tokenizer(directory, WINDOWED_DECODER, seed=0)
    return directory


@pytest.fixture(scope="module")
def decoder(checkpoint_dir) -> CodecDecoder:
    return load_codec_decoder(checkpoint_dir)


def _codes(count: int, frames: int, seed: int) -> list[torch.Tensor]:
    return [random_codes(frames, 16, CODEBOOK_SIZE, seed=seed + i) for i in range(count)]


def _stream_all(slots: SlotDecoder, ids: list[int], codes: list[torch.Tensor],
                schedule: list[int]) -> list[torch.Tensor]:
    """Every stream advances by `schedule[step]` frames per call, all in one call per step."""
    outputs: list[list[torch.Tensor]] = [[] for _ in ids]
    start = 0
    for size in schedule:
        audio = slots.decode_chunks(ids, [c[start:start + size] for c in codes])
        for row, samples in enumerate(audio):
            assert samples.shape == (codes[row][start:start + size].shape[0] * slots.decoder.samples_per_frame,)
            outputs[row].append(samples)
        start += size
    return [torch.cat(parts) for parts in outputs]


def test_priming_passes_cover_any_reference_in_the_prepared_lengths_longest_first():
    assert priming_passes(75) == [64, 8, 2, 1] and priming_passes(0) == [] and priming_passes(128) == [64, 64]
    for frames in range(0, 400):
        passes = priming_passes(frames)
        assert sum(passes) == frames and set(passes) <= set(PRIME_PASS_LENGTHS), frames
        assert passes == sorted(passes, reverse=True) and len(passes) <= frames // 64 + 6, frames


def test_after_the_priming_warm_up_a_reference_of_any_length_builds_no_step(decoder, monkeypatch):
    """Every pass runs a step the warm-up built (on CUDA: captured), so none meets cuDNN at a new length."""
    slots = SlotDecoder(decoder, max_streams=1, max_rows=1, capture=False)
    slots.warm_up(priming=True)
    prepared = dict(slots._priming_steps)
    assert sorted(prepared) == sorted(PRIME_PASS_LENGTHS)
    ran = []
    for step in prepared.values():
        monkeypatch.setattr(step, "run", lambda s, c, n, _run=step.run: ran.append(c.shape[1]) or _run(s, c, n))
    for frames in (1, 13, 70):
        slots.primed_state(random_codes(frames, 16, CODEBOOK_SIZE, seed=frames))
    assert slots._priming_steps == prepared and ran == [1, 8, 4, 1, 64, 4, 2]


def test_warm_up_builds_every_shape_up_front(decoder):
    slots = SlotDecoder(decoder, max_streams=2, max_rows=4, max_chunk_frames=3, capture=False)
    slots.warm_up()
    assert slots.shapes == [(rows, n) for rows in (1, 2, 4) for n in (1, 2, 3)]
    wide = SlotDecoder(decoder, max_streams=2, max_rows=20, max_chunk_frames=8, capture=False)
    assert wide.max_rows == 20 and wide.frame_buckets == (1, 2, 4, 8)
    # Rows by 8 for the short passes, by 4 for passes of 4 frames and more (a padded row costs them most).
    assert wide.rows_by_frames == {1: (1, 2, 4, 8, 16, 20), 2: (1, 2, 4, 8, 16, 20), 4: (1, 2, 4, 8, 12, 16, 20),
                                   8: (1, 2, 4, 8, 12, 16, 20)}
    assert slots.num_graphs == 0 and slots.capture_failures == {}


def test_streams_in_shared_padded_steps_equal_their_full_decodes(decoder):
    """Five streams (two passes of max_rows 4 each step, the second padded) follow decode's chunking; each
    equals its own full decode."""
    codes = _codes(5, sum(DECODE_SCHEDULE), seed=200)
    slots = SlotDecoder(decoder, max_streams=6, max_rows=4, capture=False)
    ids = [slots.acquire() for _ in codes]
    for stream_codes, streamed in zip(codes, _stream_all(slots, ids, codes, DECODE_SCHEDULE)):
        assert float((streamed - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE
    assert [slots.pool.num_frames(i) for i in ids] == [sum(DECODE_SCHEDULE)] * 5


def test_streams_at_different_positions_and_lengths_share_calls(decoder):
    """Mixed chunk lengths in one call (one pass per length), a chunk longer than the step's maximum (cut into
    pieces), a stream listed twice in a call (its chunks in order), and an empty chunk."""
    codes = _codes(3, 30, seed=300)
    slots = SlotDecoder(decoder, max_streams=3, max_rows=2, max_chunk_frames=4, capture=False)
    a, b, c = (slots.acquire() for _ in codes)
    first = slots.decode_chunks([a, b, c], [codes[0][:3], codes[1][:11], codes[2][:0]])
    second = slots.decode_chunks([c, a, c, b], [codes[2][:5], codes[0][3:30], codes[2][5:30], codes[1][11:30]])
    assert first[2].shape == (0,)
    got = [torch.cat([first[0], second[1]]), torch.cat([first[1], second[3]]), torch.cat([second[0], second[2]])]
    for stream_codes, streamed in zip(codes, got):
        assert float((streamed - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE


def test_padding_rows_never_change_real_rows(decoder):
    """The same three streams, decoded in a bucket of 4 padded with one padding row, and in a bucket of 4 with a
    fourth real stream: the three give the same bits. The scratch slot padding reads stays a fresh state."""
    codes = _codes(4, sum(DECODE_SCHEDULE), seed=400)
    padded = SlotDecoder(decoder, max_streams=4, max_rows=4, capture=False)
    full = SlotDecoder(decoder, max_streams=4, max_rows=4, capture=False)
    with_padding = _stream_all(padded, [padded.acquire() for _ in range(3)], codes[:3], DECODE_SCHEDULE)
    with_fourth = _stream_all(full, [full.acquire() for _ in range(4)], codes, DECODE_SCHEDULE)
    for row in range(3):
        assert torch.equal(with_padding[row], with_fourth[row])
    scratch = padded.pool.scratch
    assert not padded.pool.flat[scratch].any() and int(padded.pool.positions[scratch]) == 0


def test_a_released_slot_starts_the_next_stream_from_a_clean_state(decoder):
    codes = _codes(2, 20, seed=500)
    slots = SlotDecoder(decoder, max_streams=1, max_rows=1, capture=False)
    slot = slots.acquire()
    slots.decode_chunks([slot], [codes[0][:13]])
    slots.release(slot)
    again = slots.acquire()
    assert again == slot and not slots.pool.flat[slot].any() and slots.pool.num_frames(slot) == 0
    reused = _stream_all(slots, [again], codes[1:], [2, 2, 4, 8, 4])[0]
    fresh_slots = SlotDecoder(decoder, max_streams=1, max_rows=1, capture=False)
    fresh = _stream_all(fresh_slots, [fresh_slots.acquire()], codes[1:], [2, 2, 4, 8, 4])[0]
    assert torch.equal(reused, fresh)
    assert float((reused - decoder.decode(codes[1])).abs().max()) <= TOLERANCE


def test_each_chunks_audio_is_handed_out_as_its_pass_ends(decoder):
    """`on_ready` hears of each entry once all its pieces are decoded: the first round's chunks (4, the first 4 of
    6, and 2 frames: one pass, the 2 padded) together, and a chunk longer than `max_chunk_frames` only after its last
    piece; the return value is the same audio."""
    slots = SlotDecoder(decoder, max_streams=4, max_rows=4, max_chunk_frames=4, capture=False)
    ids = [slots.acquire() for _ in range(3)]
    codes = [random_codes(frames, 16, CODEBOOK_SIZE, seed=800 + frames) for frames in (4, 6, 2)]
    heard: list[tuple[list[int], list[torch.Tensor]]] = []
    audio = slots.decode_chunks(ids, codes, on_ready=lambda entries, samples: heard.append((entries, samples)))
    assert [entries for entries, _ in heard] == [[0, 2], [1]]
    for entries, samples in heard:
        for entry, heard_audio in zip(entries, samples):
            torch.testing.assert_close(heard_audio, audio[entry], rtol=0, atol=0)
    for stream_audio, stream_codes in zip(audio, codes):
        assert float((stream_audio - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE
    assert [slots.pool.num_frames(slot) for slot in ids] == [4, 6, 2], "each advanced by its own frames"


def test_chunks_of_every_length_in_one_padded_pass_equal_their_full_decodes(decoder):
    """Five streams whose chunk lengths differ in every call (1 to 8 frames, shifted per stream), each call one
    padded pass (counted): each stream equals its own full decode, and its position is its own frames."""
    schedules = ragged_schedules(5, 6)
    codes = [random_codes(sum(schedule), 16, CODEBOOK_SIZE, seed=900 + n) for n, schedule in enumerate(schedules)]
    slots = SlotDecoder(decoder, max_streams=5, max_rows=8, max_chunk_frames=8, capture=False)
    ids = [slots.acquire() for _ in codes]
    passes = []
    run_pass = slots._run_pass
    slots._run_pass = lambda s, c, h: passes.append(len(c)) or run_pass(s, c, h)
    audio = decode_ragged(slots, ids, codes, schedules)
    assert passes == [5] * 6 and slots.num_passes == 6
    assert slots.num_row_frames == sum(map(sum, schedules)) and slots.num_padded_row_frames == 6 * 8 * 8
    for stream_codes, streamed in zip(codes, audio):
        assert float((streamed - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE
    assert [slots.pool.num_frames(slot) for slot in ids] == [sum(schedule) for schedule in schedules]


def test_long_passes_pad_to_finer_row_buckets_than_short_ones(decoder):
    """Ten 8-frame chunks run as 12 padded rows (a padded row of a long pass costs most), then ten 2-frame
    chunks of the same streams as 16; every stream still equals its own full decode."""
    slots = SlotDecoder(decoder, max_streams=10, max_rows=16, max_chunk_frames=8, capture=False)
    ids = [slots.acquire() for _ in range(10)]
    codes = _codes(10, 10, seed=1000)
    first = slots.decode_chunks(ids, [c[:8] for c in codes])
    assert (slots.num_passes, slots.num_padded_row_frames) == (1, 12 * 8)
    second = slots.decode_chunks(ids, [c[8:] for c in codes])
    assert (slots.num_passes, slots.num_padded_row_frames) == (2, 12 * 8 + 16 * 2)
    for stream_codes, head, tail in zip(codes, first, second):
        assert float((torch.cat((head, tail)) - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE


def test_misuse_is_refused_before_any_state_changes(decoder):
    slots = SlotDecoder(decoder, max_streams=2, max_rows=2, capture=False)
    a, b = slots.acquire(), slots.acquire()
    with pytest.raises(SlotsExhausted) as full:
        slots.acquire()
    assert full.value.code == "slots_exhausted"
    good = random_codes(3, 16, CODEBOOK_SIZE, seed=1)
    bad = good.clone()
    bad[1, 4] = CODEBOOK_SIZE
    with pytest.raises(CodecInputError) as out_of_range:
        slots.decode_chunks([a, b], [good, bad])
    assert out_of_range.value.code == "codes_out_of_range"
    slots.release(b)
    with pytest.raises(CodecInputError) as released:
        slots.decode_chunks([a, b], [good, good])
    assert released.value.code == "slot_not_in_use"
    with pytest.raises(CodecInputError):
        slots.release(b)
    assert slots.pool.num_frames(a) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphed_steps_equal_eager_steps_on_cuda(checkpoint_dir, dtype):
    decoder = load_codec_decoder(checkpoint_dir, device="cuda", dtype=dtype)
    codes = _codes(3, sum(DECODE_SCHEDULE), seed=600)
    graphed = SlotDecoder(decoder, max_streams=3, max_rows=4, capture=True)
    graphed.warm_up()
    eager = SlotDecoder(decoder, max_streams=3, max_rows=4, capture=False)
    assert graphed.capture_failures == {} and graphed.num_graphs == 3 * 4
    replayed = _stream_all(graphed, [graphed.acquire() for _ in codes], codes, DECODE_SCHEDULE)
    direct = _stream_all(eager, [eager.acquire() for _ in codes], codes, DECODE_SCHEDULE)
    for row, stream_codes in enumerate(codes):
        full = decoder.decode(stream_codes)
        if dtype == torch.float32:
            assert float((replayed[row] - direct[row]).abs().max()) <= TOLERANCE
            assert float((replayed[row] - full).abs().max()) <= TOLERANCE
        else:  # test_codec_parity.py's bfloat16 criterion: within a tenth of the signal's spread
            for other in (direct[row], full):
                assert float((replayed[row] - other).pow(2).mean().sqrt()) < 0.1 * float(full.std())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU"))])
def test_a_voice_primed_on_another_thread_continues_as_a_full_decode(checkpoint_dir, device):
    """The vocoder's priming thread: the reference decoded in a pool of its own (on CUDA, on a stream of its own)
    while other streams are decoded (on CUDA, graphs replaying), then copied into a slot whose chunks continue it
    exactly (float32)."""
    decoder = load_codec_decoder(checkpoint_dir, device=device, dtype=torch.float32)
    slots = SlotDecoder(decoder, max_streams=3, max_rows=4, capture=device == "cuda")
    slots.warm_up(priming=True)
    assert not slots.priming_capture_failures
    context, codes, busy = (random_codes(n, 16, CODEBOOK_SIZE, seed=700 + n) for n in (21, 10, 40))
    other = slots.acquire()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as primer:
        primed = primer.submit(slots.primed_state, context)
        _stream_all(slots, [other], [busy], [8] * 5)  # graphs replaying on the codec's stream meanwhile
        state = primed.result()
    clone = slots.acquire()
    slots.restore(clone, state)
    voiced = _stream_all(slots, [clone], [codes], [2, 8])[0]
    full = decoder.decode(torch.cat([context, codes]))
    assert float((voiced - full[21 * decoder.samples_per_frame:]).abs().max()) <= TOLERANCE
    assert float((voiced - decoder.decode(codes)).abs().max()) > 100 * TOLERANCE, "the context must matter"


def test_an_urgent_chunk_is_handed_out_before_the_pass_it_would_have_shared(decoder):
    """Three 8-frame chunks and a first chunk of one frame: by cost one padded pass (the one frame waits for all of
    it); marked urgent, the first chunk's audio is handed out alone, first, and every stream still equals its full
    decode."""
    slots = SlotDecoder(decoder, max_streams=4, max_rows=4, max_chunk_frames=8, capture=False)
    ids = [slots.acquire() for _ in range(4)]
    codes = [random_codes(frames, 16, CODEBOOK_SIZE, seed=1000 + n) for n, frames in enumerate((8, 8, 1, 8))]
    heard: list[list[int]] = []
    together = SlotDecoder(decoder, max_streams=4, max_rows=4, max_chunk_frames=8, capture=False)
    together.decode_chunks([together.acquire() for _ in range(4)], codes,
                           on_ready=lambda entries, _: heard.append(entries))
    assert heard == [[0, 1, 2, 3]]
    heard.clear()
    audio = slots.decode_chunks(ids, codes, on_ready=lambda entries, _: heard.append(entries),
                                urgent=[False, False, True, False])
    assert heard == [[2], [0, 1, 3]]
    for stream_audio, stream_codes in zip(audio, codes):
        assert float((stream_audio - decoder.decode(stream_codes)).abs().max()) <= TOLERANCE
