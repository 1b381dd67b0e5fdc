"""The vocoder's dilated causal convolutions as one Triton implicit-GEMM kernel (`triton_conv.causal_conv`) against
torch's convolution, under Triton's interpreter on the CPU and compiled on CUDA; and a whole codec decode with it
against one without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.triton_interpreter import interpreted


@torch.no_grad()
def conv_error(device: str, dtype_name: str) -> float:
    """Largest difference of `causal_conv` from `F.conv1d` over the same buffer, relative to the output's peak: taps
    and dilations of the vocoder's units, channels in and out few and many (not multiples of a tile), both layouts,
    with and without a bias, the buffer a view into a wider one."""
    from services.kernels.codec.layout import channels_dense
    from services.kernels.codec.triton_conv import ConvTile, causal_conv

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(11)
    worst = 0.0
    for batch, c_in, c_out, taps, dilation, length, with_bias in ((2, 3, 5, 7, 1, 9, True), (1, 20, 20, 7, 3, 40, False),
                                                                  (3, 48, 17, 3, 1, 70, True), (2, 40, 40, 7, 9, 5, True)):
        history = (taps - 1) * dilation
        for last in (False, True):
            wide = torch.randn((batch, c_in, history + length + 4), generator=generator).to(device, dtype)
            if last:
                wide = wide.transpose(1, 2).contiguous().transpose(1, 2)
            full = wide[..., 4:]
            weight = (torch.randn((c_out, c_in, taps), generator=generator) * (c_in * taps) ** -0.5).to(device, dtype)
            bias = torch.randn(c_out, generator=generator).to(device, dtype) if with_bias else None
            for tile in (None, ConvTile(), ConvTile(block_m=32, block_n=16, block_k=16, num_warps=4)):
                got = causal_conv(full, weight, dilation, bias, tile)
                # float64: torch's float32 convolutions on CUDA round to TF32 (cuDNN's default), the kernel's do not
                expected = F.conv1d(full.double(), weight.double(), None if bias is None else bias.double(),
                                    dilation=dilation).float()
                assert got.shape == expected.shape and channels_dense(got) == last
                worst = max(worst, float((got.float() - expected).abs().max() / expected.abs().max()))
    return worst


@torch.no_grad()
def decode_error_with_the_conv(device: str) -> float:
    """Largest difference, relative to the audio's peak, between the test codec's chunked decode with every fused pass
    and this convolution on, and one with the fused passes off (tests.kernels.test_fused_codec_convs.fused_decode_error,
    in its interpreter's chunks: the only caller is the interpreter's test)."""
    from services.model.codec import causal_conv
    from services.kernels.codec import triton_conv
    from tests.kernels.test_fused_codec_convs import INTERPRETER_CHUNKS, fused_decode_error

    compiles_for = causal_conv.compiles_for
    causal_conv.compiles_for = lambda device: True  # the fused decode's switch, for the convolutions too
    calls = []
    convolve = triton_conv.causal_conv
    # Long tiles: under the interpreter a program's cost is its Python, not its size (the kernel's tiles are checked
    # above), and the test codec's audio-rate rows are many.
    long_tile = triton_conv.ConvTile(block_m=2048, block_n=32, block_k=32)
    triton_conv.causal_conv = lambda full, weight, dilation, bias=None: calls.append(1) or convolve(
        full, weight, dilation, bias, long_tile)
    try:
        error = fused_decode_error(device, INTERPRETER_CHUNKS)
    finally:
        triton_conv.causal_conv = convolve
        causal_conv.compiles_for = compiles_for
    assert calls, "no convolution took the Triton kernel"
    return error


@torch.no_grad()
def ops_bench_rows() -> tuple[float, int]:
    """`loadtest.gpu.codec_ops_bench`'s Triton rows for one small conv on the CPU (a plain call for its timer): the
    worst error over its launch shapes, and how many it timed."""
    from loadtest.gpu import codec_ops_bench

    conv = torch.nn.Conv1d(8, 8, 7, dilation=3)
    x = torch.randn((2, 8, 30 + 18), generator=torch.Generator().manual_seed(2))
    rows = codec_ops_bench._triton_conv_rows(conv, x, conv(x).float(), timer=lambda fn, device: (fn(), 1.0)[1])
    return max(row["max_rel_error"] for row in rows), len(rows)


def test_the_codec_ops_bench_times_every_launch_shape_of_the_triton_conv():
    from loadtest.gpu.codec_ops_bench import CONV_TILES

    error, count = interpreted("tests.kernels.test_triton_conv.ops_bench_rows()")
    assert error < 1e-5 and count == len(CONV_TILES)


def test_the_triton_conv_equals_torch_under_the_interpreter():
    assert interpreted("tests.kernels.test_triton_conv.conv_error('cpu', 'float32')") < 1e-5


def test_a_decode_with_the_triton_conv_equals_one_without_under_the_interpreter():
    assert interpreted("tests.kernels.test_triton_conv.decode_error_with_the_conv('cpu')") < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a CUDA device")
def test_the_triton_conv_on_cuda():
    assert conv_error("cuda", "float32") < 1e-5
    assert conv_error("cuda", "bfloat16") < 2e-2


def test_the_triton_conv_refuses_a_buffer_shorter_than_its_history():
    from services.kernels.codec.triton_conv import causal_conv

    with pytest.raises(ValueError, match="dilation 3"):
        causal_conv(torch.zeros((1, 4, 10)), torch.zeros((4, 4, 7)), 3)
    with pytest.raises(ValueError, match="dense"):
        causal_conv(torch.zeros((1, 8, 40))[:, ::2, ::2], torch.zeros((4, 4, 7)), 1)


def test_the_triton_conv_serves_only_the_convs_that_fit():
    from services.kernels.codec import triton_conv

    full, weight = torch.zeros((1, 4, 20)), torch.zeros((6, 4, 7))
    assert triton_conv.serves(full, weight, 1)
    assert not triton_conv.serves(full, weight, 2)  # grouped
    assert not triton_conv.serves(full, torch.zeros((6, 4, 1)), 1)  # one tap: a plain product
    assert not triton_conv.serves(torch.zeros((1, 5, 20)), weight, 1)
    wide = triton_conv.MAX_CHANNELS + 1  # the first block's 768-channel units stay with cuDNN (the card's answer)
    assert not triton_conv.serves(torch.zeros((1, wide, 20)), torch.zeros((6, wide, 7)), 1)


def test_each_conv_gets_the_launch_shape_that_won_on_the_card():
    from services.kernels.codec.triton_conv import ConvTile, tile_for

    assert tile_for(384, 384) == tile_for(192, 192) == ConvTile(128, 128, 64, 8, 3)
    assert tile_for(96, 96) == ConvTile(128, 128, 32, 8, 3)
    assert tile_for(96, 1) == ConvTile(128, 64, 32, 4, 3)  # the output conv's one channel


@pytest.mark.parametrize("switched_on", [True, False])
def test_the_codec_loader_hands_the_setting_to_every_convolution(tmp_path, switched_on):
    """The `triton_conv` setting reaches the convolutions through the loader (nothing reads the environment), and a
    convolution switched off keeps cuDNN's path even where the kernel would serve."""
    from services.kernels.codec import triton_conv
    from services.model.codec import causal_conv, load_codec_decoder
    from services.model.kernel_choices import KernelChoices
    from tests.support.codec_reference import WINDOWED_DECODER, save_reference_tokenizer

    save_reference_tokenizer(tmp_path, WINDOWED_DECODER, seed=0)
    decoder = load_codec_decoder(tmp_path, choices=KernelChoices(triton_conv=switched_on))
    convs = [m for m in decoder.modules() if isinstance(m, causal_conv.StreamingConv)]
    assert convs and all(conv.triton_conv is switched_on for conv in convs)
    conv = next(m for m in convs if isinstance(m, causal_conv.CausalConv1d) and m.conv.kernel_size[0] > 1)
    full = torch.zeros((1, conv.conv.in_channels, conv.history_len + 40))
    taken = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(causal_conv, "compiles_for", lambda device: True)
        patch.setattr(triton_conv, "causal_conv", lambda *args, **kwargs: taken.append(1) or "kernel")
        result = conv.convolve(full)
    assert isinstance(result, str) is switched_on and bool(taken) is switched_on
