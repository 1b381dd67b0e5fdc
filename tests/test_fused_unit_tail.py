"""A residual unit's tail in one kernel (`fused_unit_tail.unit_tail`: SnakeBeta of h + b1, the 1x1 convolution, its
bias and the residual) against the torch form, under Triton's interpreter on the CPU and compiled on CUDA; and a whole
codec decode with it against one without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.triton_interpreter import interpreted


def _torch_tail(h, x, weight, bias1, log_alpha, log_beta, bias2, epsilon):
    # The product in float64: torch's float32 convolutions on CUDA round to TF32 (cuDNN's default), the kernel's do not.
    shifted = (h + bias1[None, :, None]).float()
    alpha, beta = log_alpha.exp().float()[None, :, None], log_beta.exp().float()[None, :, None]
    activated = (shifted + (1.0 / (beta + epsilon)) * torch.sin(shifted * alpha).pow(2)).to(h.dtype)
    return x + (F.conv1d(activated.double(), weight.double()).to(h.dtype) + bias2[None, :, None])


@torch.no_grad()
def tail_error(device: str, dtype_name: str) -> float:
    """Largest difference of `unit_tail` from the torch form, relative to the output's peak: channels few and many (not
    a multiple of a tile), rows fewer than a program's and more, both layouts, h a view of a wider buffer."""
    from services.model.codec.fused_unit_tail import unit_tail
    from services.model.codec.layout import channels_dense
    from services.model.codec.vocoder import _SNAKE_EPSILON

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(7)
    worst = 0.0
    for batch, channels, length in ((2, 3, 10), (3, 20, 50), (1, 96, 70), (2, 48, 33)):
        for last in (False, True):
            def make(*shape, scale=1.0):
                return (scale * torch.randn(shape, generator=generator)).to(device, dtype)
            wide, x = make(batch, channels, length + 5, scale=2.0), make(batch, channels, length)
            if last:
                wide, x = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (wide, x))
            h = wide[..., 5:]
            weight = make(channels, channels, 1, scale=channels**-0.5)
            bias1, bias2 = make(channels, scale=0.1), make(channels, scale=0.1)
            log_alpha, log_beta = make(channels, scale=0.3), make(channels, scale=0.3)
            got = unit_tail(h, x, weight, bias1, log_alpha, log_beta, bias2, _SNAKE_EPSILON)
            expected = _torch_tail(h, x, weight, bias1, log_alpha, log_beta, bias2, _SNAKE_EPSILON)
            assert got.shape == expected.shape and channels_dense(got) == (last and channels > 1)
            worst = max(worst, float((got.float() - expected.float()).abs().max() / expected.float().abs().max()))
    return worst


@torch.no_grad()
def decode_error_with_the_tail(device: str) -> float:
    """Largest difference, relative to the audio's peak, between the test codec's chunked decode with every fused pass
    and the unit tail on, and one with the fused passes off (tests.kernels.test_fused_codec_convs.fused_decode_error)."""
    from services.model.codec import fused_unit_tail
    from tests.kernels.test_fused_codec_convs import fused_decode_error

    fused_unit_tail.SWITCHED_ON = True
    calls = []
    tail = fused_unit_tail.unit_tail
    fused_unit_tail.unit_tail = lambda *args: calls.append(1) or tail(*args)
    try:
        error = fused_decode_error(device)
    finally:
        fused_unit_tail.unit_tail, fused_unit_tail.SWITCHED_ON = tail, False
    assert calls, "no residual unit took the fused tail"
    return error


def ops_bench_row() -> tuple[float, list[str]]:
    """`loadtest.gpu.codec_ops_bench`'s unit-tail row on the CPU (its CUDA-graph timer replaced by one plain call):
    the error of the kernel against the served passes, and the row's fields."""
    from loadtest.gpu import codec_ops_bench

    codec_ops_bench._per_call_us = lambda fn, device: (fn(), 1.0)[1]
    row = codec_ops_bench._unit_tail(24, 40, 2, torch.device("cpu"), torch.float32)
    return row["max_rel_error"], sorted(row)


def test_the_codec_ops_bench_times_the_unit_tail_against_the_passes_it_replaces():
    error, fields = interpreted("tests.test_fused_unit_tail.ops_bench_row()")
    assert error < 1e-5
    assert fields == ["channels", "fused_us", "max_rel_error", "min_bytes", "op", "passes_us", "samples"]


def test_the_unit_tail_equals_the_torch_form_under_the_interpreter():
    assert interpreted("tests.test_fused_unit_tail.tail_error('cpu', 'float32')") < 1e-5


def test_a_decode_with_the_unit_tail_equals_one_without_under_the_interpreter():
    assert interpreted("tests.test_fused_unit_tail.decode_error_with_the_tail('cpu')") < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a CUDA device")
def test_the_unit_tail_on_cuda():
    assert tail_error("cuda", "float32") < 1e-5
    assert tail_error("cuda", "bfloat16") < 2e-2
    assert decode_error_with_the_tail("cuda") < 1e-4


def test_the_unit_tail_refuses_mismatched_shapes():
    from services.model.codec import fused_unit_tail

    with pytest.raises(ValueError, match="alike"):
        fused_unit_tail.unit_tail(torch.zeros((1, 4, 8)), torch.zeros((1, 4, 9)), torch.zeros((4, 4, 1)),
                                  *[torch.zeros(4)] * 4, 1e-9)
    with pytest.raises(ValueError, match="dense"):
        fused_unit_tail.unit_tail(torch.zeros((1, 8, 8))[:, ::2, ::2], torch.zeros((1, 4, 4)), torch.zeros((4, 4, 1)),
                                  *[torch.zeros(4)] * 4, 1e-9)


def test_the_unit_tail_serves_only_when_switched_on_and_the_unit_fits(monkeypatch):
    from services.model.codec import fused_unit_tail

    h, weight, bias = torch.zeros((1, 4, 8)), torch.zeros((4, 4, 1)), torch.zeros(4)
    monkeypatch.setattr(fused_unit_tail, "SWITCHED_ON", False)
    assert not fused_unit_tail.serves(h, h, weight, bias, bias)
    monkeypatch.setattr(fused_unit_tail, "SWITCHED_ON", True)
    assert fused_unit_tail.serves(h, h, weight, bias, bias)
    assert not fused_unit_tail.serves(h, h, weight, None, bias)  # a unit without a bias keeps the passes
    assert not fused_unit_tail.serves(h, torch.zeros((1, 4, 9)), weight, bias, bias)
    assert not fused_unit_tail.serves(h, h, torch.zeros((4, 4, 3)), bias, bias)  # not a 1x1 convolution
