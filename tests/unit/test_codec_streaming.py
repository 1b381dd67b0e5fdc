"""Streaming decode is exact and stateful, on a decoder built to expose lost left context:
sliding window 4, 3 transformer layers, sequences far longer than layers x window."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from services.model.codec import CodecDecoder, load_codec_decoder
from tests.support.codec_reference import WINDOWED_DECODER, build_reference_tokenizer, random_codes

TOLERANCE = 1e-5
NUM_FRAMES = 40
CODEBOOK_SIZE = WINDOWED_DECODER["codebook_size"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    torch.set_num_threads(1)
    assert NUM_FRAMES > WINDOWED_DECODER["num_hidden_layers"] * WINDOWED_DECODER["sliding_window"]
    directory = tmp_path_factory.mktemp("codec_windowed")
    build_reference_tokenizer(directory, WINDOWED_DECODER, seed=0)
    return directory


@pytest.fixture(scope="module")
def decoder(checkpoint_dir) -> CodecDecoder:
    return load_codec_decoder(checkpoint_dir)


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    return random_codes(NUM_FRAMES, 16, CODEBOOK_SIZE, seed=11)


def _storage_bytes(state) -> int:
    return sum(t.untyped_storage().nbytes() for t in state.tensors())


def _stream(decoder: CodecDecoder, codes: torch.Tensor, chunk_sizes: list[int]) -> torch.Tensor:
    """Decode `codes` chunk by chunk, asserting after each chunk that the state did not grow."""
    state = decoder.new_stream()
    shapes, num_bytes, storage = state.shapes(), state.num_bytes(), _storage_bytes(state)
    pieces, start = [], 0
    for size in chunk_sizes:
        piece = decoder.decode_chunk(state, codes[start : start + size])
        assert piece.shape == (min(size, codes.shape[0] - start) * decoder.samples_per_frame,)
        assert state.shapes() == shapes and state.num_bytes() == num_bytes
        assert _storage_bytes(state) == storage, "the state must not pin growing buffers"
        pieces.append(piece)
        start += size
    assert state.num_frames == codes.shape[0]
    return torch.cat(pieces)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_streaming_equals_full_decode(checkpoint_dir, codes, device, chunk):
    decoder = load_codec_decoder(checkpoint_dir, device=device)
    full = decoder.decode(codes)
    streamed = _stream(decoder, codes, [chunk] * -(-NUM_FRAMES // chunk))
    assert float((streamed - full).abs().max()) <= TOLERANCE


def test_irregular_chunks_equal_full_decode(decoder, codes):
    sizes = [1, 7, 2, 3, 1, 1, 7, 3, 2, 5, 8]
    assert sum(sizes) == NUM_FRAMES
    assert float((_stream(decoder, codes, sizes) - decoder.decode(codes)).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_stateless_redecode_would_fail_the_streaming_check(decoder, codes, chunk):
    """Decoding each chunk alone, or with one sliding window of left context, loses context
    that the state carries: both miss the tolerance by orders of magnitude."""
    full = decoder.decode(codes)
    samples = decoder.samples_per_frame
    for context in (0, WINDOWED_DECODER["sliding_window"]):
        pieces = []
        for start in range(0, NUM_FRAMES, chunk):
            first = max(0, start - context)
            window = decoder.decode(codes[first : start + chunk])
            pieces.append(window[(start - first) * samples :])
        error = float((torch.cat(pieces) - full).abs().max())
        assert error > 100 * TOLERANCE, f"left context {context} should not be enough (error {error})"


def test_chunk_work_does_not_grow_with_position(decoder):
    """The same 7-frame chunk costs the same FLOPs at frame 7 and at frame 300."""
    codes = random_codes(307, 16, CODEBOOK_SIZE, seed=5)

    def flops_of_chunk(start: int) -> int:
        state = decoder.new_stream()
        decoder.decode_chunk(state, codes[:start])
        with FlopCounterMode(display=False) as counter:
            decoder.decode_chunk(state, codes[start : start + 7])
        return counter.get_total_flops()

    early, late = flops_of_chunk(7), flops_of_chunk(300)
    assert early > 0 and early == late


def test_decode_chunks_batches_streams_at_different_positions(decoder):
    """Three streams advance with chunks of mixed lengths in shared calls; each equals its own
    full decode, whatever the other streams in the batch."""
    all_codes = [random_codes(NUM_FRAMES, 16, CODEBOOK_SIZE, seed=100 + i) for i in range(3)]
    schedules = [[3, 7, 7, 3, 20], [3, 3, 7, 20, 7], [7, 7, 3, 3, 20]]
    states = [decoder.new_stream() for _ in all_codes]
    outputs: list[list[torch.Tensor]] = [[] for _ in all_codes]
    offsets = [0, 0, 0]
    for step in range(len(schedules[0])):
        chunks = []
        for row, schedule in enumerate(schedules):
            chunks.append(all_codes[row][offsets[row] : offsets[row] + schedule[step]])
            offsets[row] += schedule[step]
        for row, audio in enumerate(decoder.decode_chunks(states, chunks)):
            assert audio.shape == (chunks[row].shape[0] * decoder.samples_per_frame,)
            outputs[row].append(audio)
    for row, stream_codes in enumerate(all_codes):
        error = float((torch.cat(outputs[row]) - decoder.decode(stream_codes)).abs().max())
        assert error <= TOLERANCE


def test_decode_chunks_takes_a_streams_chunks_in_order(decoder, codes):
    """A stream listed twice in one call (two chunks queued) advances chunk after chunk."""
    state, other = decoder.new_stream(), decoder.new_stream()
    other_codes = random_codes(5, 16, CODEBOOK_SIZE, seed=12)
    first, _, second, third = decoder.decode_chunks(
        [state, other, state, state], [codes[:3], other_codes, codes[3:6], codes[6:]]
    )
    assert state.num_frames == NUM_FRAMES and other.num_frames == 5
    assert float((torch.cat([first, second, third]) - decoder.decode(codes)).abs().max()) <= TOLERANCE


def test_empty_chunk_is_a_no_op(decoder, codes):
    state = decoder.new_stream()
    first = decoder.decode_chunk(state, codes[:3])
    empty = decoder.decode_chunk(state, codes[:0])
    rest = decoder.decode_chunk(state, codes[3:])
    assert empty.shape == (0,) and state.num_frames == NUM_FRAMES
    assert float((torch.cat([first, rest]) - decoder.decode(codes)).abs().max()) <= TOLERANCE


def test_long_input_decode_equals_stream(decoder):
    """Past 300 frames `decode` runs in pieces internally; it stays equal to any streaming."""
    codes = random_codes(310, 16, CODEBOOK_SIZE, seed=9)
    streamed = _stream(decoder, codes, [25] * 13)
    assert float((decoder.decode(codes) - streamed).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_fused_projections_decode_as_the_separate_ones_and_keep_the_checkpoint_names(checkpoint_dir, codes, device):
    """The loader fuses q/k/v and gate/up into one weight each: the state dict keeps its names and values, the
    decode equals the separate projections', and a decoder moved after fusing falls back to its own weights."""
    fused = load_codec_decoder(checkpoint_dir, device=device)
    separate = load_codec_decoder(checkpoint_dir, device=device)
    for layer in separate.pre_transformer.layers:
        layer.self_attn.qkv, layer.mlp.gate_up = None, None
    attention = fused.pre_transformer.layers[0].self_attn
    assert attention.qkv is not None and attention.q_proj.weight.data_ptr() == attention.qkv[0].data_ptr()
    assert fused.state_dict().keys() == separate.state_dict().keys()
    for name, tensor in fused.state_dict().items():
        assert torch.equal(tensor, separate.state_dict()[name]), name
    expected = separate.decode(codes)
    assert float((fused.decode(codes) - expected).abs().max()) <= TOLERANCE
    moved = fused.to(torch.float64)  # the fused weights stay float32: the layers use their own
    assert float((moved.decode(codes).float() - expected).abs().max()) <= TOLERANCE
