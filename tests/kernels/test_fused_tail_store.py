"""The codec's state tails written straight into the slot pool (`fused_tail_store.store_tails`) against torch's
gather and index_copy_ (under Triton's interpreter on the CPU, compiled on CUDA), and a whole ragged slot decode with
the direct stores on, against the full decode."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from tests.support.triton_interpreter import interpreted


@torch.no_grad()
def tail_store_mismatches(device: str) -> int:
    """Elements where the kernel's pool differs from the torch form's: conv histories ([B, C, L], samples dense and
    channels dense) and K/V windows ([B, heads, L, dim]), rows of every length, a padding row sent to a sink slot, and
    the pool's other rows untouched."""
    from services.kernels.codec.fused_tail_store import store_tails

    generator = torch.Generator().manual_seed(5)
    mismatches = 0
    for shape, history, per_frame, frames, channels_last in (((3, 5, None), 6, 4, 4, False),
                                                           ((3, 5, None), 6, 4, 4, True),
                                                           ((4, 3, None), 54, 16, 2, True),
                                                           ((2, 4, 8), 7, 1, 8, False)):
        batch, inner, width = shape
        length = history + frames * per_frame
        full_shape = (batch, inner, length) if width is None else (batch, inner, length, width)
        full = torch.randn(full_shape, generator=generator).to(device)
        if channels_last:
            full = full.transpose(1, 2).contiguous().transpose(1, 2)
        lengths = torch.randint(1, frames + 1, (batch,), generator=generator).to(device)
        slots = batch + 2
        targets = torch.randperm(slots, generator=generator)[:batch].to(device)
        pool_shape = (slots, inner, history) if width is None else (slots, inner, history, width)
        pool = torch.randn(pool_shape, generator=generator).to(device)
        expected = pool.clone()
        for row in range(batch):
            start = int(lengths[row]) * per_frame
            expected[int(targets[row])] = full[row, :, start:start + history]
        store_tails(full, history, per_frame, lengths, targets, pool)
        mismatches += int((pool != expected).sum())
    return mismatches


def ragged_direct_decode_error(device: str) -> float:
    """Three streams in ragged passes (lengths 1 to 8 in every call) with the pool's direct stores forced on: the
    largest difference from each stream's full decode."""
    from services.model.codec import load_codec_decoder, slot_pool
    from services.model.codec.slot_decoder import SlotDecoder
    from tests.support.codec_reference import WINDOWED_DECODER, random_codes, save_reference_tokenizer
    from tests.support.ragged_streams import decode_ragged, ragged_schedules

    torch.set_num_threads(1)
    compiles_for = slot_pool.compiles_for
    slot_pool.compiles_for = lambda _device: True  # the interpreter runs the kernel on the CPU; put back after
    try:
        with tempfile.TemporaryDirectory() as directory:
            save_reference_tokenizer(Path(directory), WINDOWED_DECODER, seed=0)
            decoder = load_codec_decoder(directory, device=device)
        schedules = ragged_schedules(3, 5)
        codes = [random_codes(sum(s), 16, WINDOWED_DECODER["codebook_size"], seed=50 + n)
                 for n, s in enumerate(schedules)]
        slots = SlotDecoder(decoder, max_streams=3, max_rows=4, capture=False)
        audio = decode_ragged(slots, [slots.acquire() for _ in codes], codes, schedules)
    finally:
        slot_pool.compiles_for = compiles_for
    return max(float((streamed - decoder.decode(c)).abs().max()) for streamed, c in zip(audio, codes))


def test_tail_store_equals_gather_and_copy_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_tail_store.tail_store_mismatches('cpu')") == 0


def test_a_ragged_decode_with_direct_stores_equals_the_full_decode_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_tail_store.ragged_direct_decode_error('cpu')") < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_tail_store_on_cuda():
    assert tail_store_mismatches("cuda") == 0


def test_tail_store_refuses_a_pool_of_another_shape():
    from services.kernels.codec.fused_tail_store import store_tails

    with pytest.raises(ValueError, match="store_tails needs"):
        store_tails(torch.zeros(2, 3, 10), 4, 1, torch.ones(2, dtype=torch.long), torch.arange(2),
                    torch.zeros(4, 3, 5))
