"""The vocoder's fused passes against the torch forms they replace (under Triton's interpreter on the CPU, compiled
on CUDA): a convolution's bias added after it with the residual (`fused_bias.add_bias`), SnakeBeta taking the bias of
the convolution before it and writing into the next one's input buffer, and the whole codec decode, chunk by chunk,
with every fused path on against every one off."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from tests.support.triton_interpreter import interpreted


@torch.no_grad()
def bias_mismatches(device: str, dtype_name: str) -> int:
    """Elements where `add_bias` differs from torch's `residual + (y + bias)` (each sum rounded to the dtype): y dense,
    y a trimmed view (a transposed conv's output), with and without a residual, rows shorter than a tile and longer."""
    from services.kernels.codec.fused_bias import add_bias
    from services.kernels.codec.layout import TILE, channels_dense

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(3)
    mismatches = 0
    for batch, channels, length, trimmed, with_residual in ((2, 3, 40, False, True), (3, 4, 50, True, True),
                                                           (1, 2, TILE + 37, True, False), (3, 5, 4, False, True),
                                                           (2, 70, 30, True, True)):
        for last in (False, True):  # samples dense, then channels dense (channels-last)
            wide = (3 * torch.randn((batch, channels, length + 9), generator=generator)).to(device, dtype)
            if last:
                wide = wide.transpose(1, 2).contiguous().transpose(1, 2)
            y = wide[..., 4 : 4 + length] if trimmed else wide[..., :length].clone()
            bias = torch.randn(channels, generator=generator).to(device, dtype)
            residual = torch.randn((batch, channels, length), generator=generator).to(device, dtype)
            if last:
                residual = residual.transpose(1, 2).contiguous().transpose(1, 2)
            expected = y + bias[None, :, None]
            if with_residual:
                expected = residual + expected
            got = add_bias(y, bias, residual if with_residual else None)
            assert got.shape == expected.shape and channels_dense(got) == (last and channels > 1)
            mismatches += int((got != expected).sum())
    return mismatches


@torch.no_grad()
def snake_with_bias_error(device: str) -> float:
    """Largest relative difference of `snake_beta(x, bias=b, out=view)` from SnakeBeta's torch form of x + b, written
    into the part of a wider buffer after a history, which it must leave alone."""
    from services.kernels.codec.fused_snake import snake_beta
    from services.model.codec.vocoder import _SNAKE_EPSILON, SnakeBeta

    generator = torch.Generator().manual_seed(4)
    worst = 0.0
    for channels, last in ((6, False), (6, True), (70, True)):  # channels-last: x and the buffer both
        snake = SnakeBeta(channels)
        snake.alpha.copy_(0.5 * torch.randn(channels, generator=generator))
        snake.beta.copy_(0.5 * torch.randn(channels, generator=generator))
        snake = snake.to(device)
        x = (3 * torch.randn((2, channels, 30), generator=generator)).to(device)
        bias = torch.randn(channels, generator=generator).to(device)
        buffer = torch.full((2, channels, 7 + 30), 5.0, device=device)
        if last:
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
            buffer = buffer.transpose(1, 2).contiguous().transpose(1, 2)
        snake_beta(x, snake.alpha, snake.beta, _SNAKE_EPSILON, bias=bias, out=buffer[..., 7:])
        assert bool((buffer[..., :7] == 5.0).all()), "the history part was written"
        shifted = x + bias[None, :, None]
        alpha, beta = snake.alpha.exp()[None, :, None], snake.beta.exp()[None, :, None]
        expected = shifted + (1.0 / (beta + _SNAKE_EPSILON)) * torch.sin(shifted * alpha).pow(2)
        worst = max(worst, float((buffer[..., 7:] - expected).abs().max() / expected.abs().max()))
    return worst


CUDA_CHUNKS = (3, 5, 7)
"""The GPU check's chunks (`loadtest.gpu.fused_codec_check.decode`)."""
INTERPRETER_CHUNKS = (1, 2, 3)
"""Under the interpreter the cost is per program, so per sample: 6 frames, not 15. Each chunk carries its histories
over: the longest at the code rate (3 frames: upsample.0's depthwise conv, 6 samples of history at twice the rate)
and the transformer's window (3 frames) reach back across both earlier chunks into the 1-frame first; chunks of
three lengths; the last chunk's audio-rate rows (3 x 1920) span several of test_triton_conv's 2048-row tiles, the
last one partial."""


@torch.no_grad()
def fused_decode_error(device: str, chunks: tuple[int, ...] = CUDA_CHUNKS) -> float:
    """Largest difference, relative to the audio's peak, between a codec decode with the fused passes forced on and
    one with them off: the windowed test decoder, its frames in `chunks` (histories carried across)."""
    from loadtest.gpu.fused_codec_check import decode
    from services.model.codec import load_codec_decoder
    from tests.support.codec_reference import WINDOWED_DECODER, random_codes, save_reference_tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        save_reference_tokenizer(Path(scratch), WINDOWED_DECODER, seed=0)
        decoder = load_codec_decoder(Path(scratch), device=device)
    codes = random_codes(sum(chunks), 16, WINDOWED_DECODER["codebook_size"], seed=5).to(device)
    plain, fused = decode(decoder, codes, False, chunks), decode(decoder, codes, True, chunks)
    assert plain.shape == fused.shape
    return float((fused - plain).abs().max() / plain.abs().max())


def test_add_bias_equals_the_torch_sums_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_codec_convs.bias_mismatches('cpu', 'float32')") == 0


def test_snake_takes_a_bias_and_writes_into_a_view_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_codec_convs.snake_with_bias_error('cpu')") < 1e-6


def test_a_decode_with_the_fused_passes_equals_one_without_under_the_interpreter():
    assert interpreted(f"tests.kernels.test_fused_codec_convs.fused_decode_error('cpu', {INTERPRETER_CHUNKS})") < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a CUDA device")
def test_the_fused_codec_passes_on_cuda():
    assert bias_mismatches("cuda", "float32") == 0 and bias_mismatches("cuda", "bfloat16") == 0
    assert snake_with_bias_error("cuda") < 1e-5
    assert fused_decode_error("cuda") < 1e-4


def test_add_bias_refuses_a_residual_of_another_shape():
    from services.kernels.codec.fused_bias import add_bias

    with pytest.raises(ValueError, match="residual"):
        add_bias(torch.zeros((1, 2, 8)), torch.zeros(2), torch.zeros((1, 2, 9)))
    with pytest.raises(ValueError, match="dense"):
        add_bias(torch.zeros((1, 4, 8))[:, ::2, ::2], torch.zeros(2))
