"""The vocoder's CUDA forms against its torch forms: the fused SnakeBeta kernel (under Triton's interpreter on the
CPU, compiled on CUDA) and a wide conv as one GEMM over its unfolded windows."""

from __future__ import annotations

import pytest
import torch

from tests.support.triton_interpreter import interpreted


@torch.no_grad()
def snake_error(device: str, dtype_name: str = "float32") -> float:
    """Largest relative difference of `snake_beta` from `SnakeBeta`'s torch expression: a dense activation, one
    longer than a tile, a strided one (samples sliced out of a wider row, as a transposed conv's output is), and
    short rows (several in one program, the last program partly empty)."""
    from services.kernels.codec.fused_snake import snake_beta
    from services.kernels.codec.layout import TILE
    from services.model.codec.vocoder import _SNAKE_EPSILON, SnakeBeta

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(11)
    worst = 0.0
    cases = ((2, 3, 40, False), (1, 2, TILE + 37, False), (3, 4, 50, True), (3, 5, 4, False))
    for batch, channels, length, sliced in cases:
        snake = SnakeBeta(channels)
        snake.alpha.copy_(0.5 * torch.randn(channels, generator=generator))
        snake.beta.copy_(0.5 * torch.randn(channels, generator=generator))
        snake = snake.to(device, dtype)
        x = (3 * torch.randn((batch, channels, length + 9), generator=generator)).to(device, dtype)
        x = x[..., 5 : 5 + length] if sliced else x[..., :length].contiguous()
        alpha, beta = snake.alpha.exp()[None, :, None], snake.beta.exp()[None, :, None]
        expected = (x + (1.0 / (beta + _SNAKE_EPSILON)) * torch.sin(x * alpha).pow(2)).float()
        got = snake_beta(x, snake.alpha, snake.beta, _SNAKE_EPSILON).float()
        assert got.shape == expected.shape
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    return worst


def test_fused_snake_equals_the_torch_expression_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_snake.snake_error('cpu')") < 1e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_fused_snake_equals_the_torch_expression_on_cuda():
    assert snake_error("cuda") < 1e-5
    assert snake_error("cuda", "bfloat16") < 2e-2


def test_snake_beta_refuses_an_activation_neither_samples_nor_channels_dense():
    from services.kernels.codec.fused_snake import snake_beta

    x = torch.zeros((1, 4, 8))[:, ::2, ::2]  # neither samples nor channels dense
    with pytest.raises(ValueError, match="dense"):
        snake_beta(x, torch.zeros(8), torch.zeros(8), 1e-9)


@torch.no_grad()
def test_a_conv_as_one_gemm_equals_the_conv():
    from services.model.codec.causal_conv import _as_gemm

    generator = torch.Generator().manual_seed(5)
    for taps, dilation, bias in ((7, 1, True), (7, 3, False), (3, 9, True), (1, 1, True)):
        conv = torch.nn.Conv1d(6, 5, taps, dilation=dilation, bias=bias)
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator))
        x = torch.randn((3, 6, 60), generator=generator)[..., 2:]  # samples sliced, as a chunk's activations are
        got = _as_gemm(conv, x)
        assert got.shape == (3, 5, 58 - (taps - 1) * dilation) and got.transpose(1, 2).is_contiguous()  # channels-last
        torch.testing.assert_close(got, conv(x), rtol=1e-5, atol=1e-5)
