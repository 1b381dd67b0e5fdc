"""The vocoder's costliest operations at serving shapes, in their torch and their CUDA forms: SnakeBeta (torch
expression against `fused_snake.snake_beta`), each kind of causal conv as cuDNN runs it (benchmark mode, as served) against its GEMM form
(`causal_conv._as_gemm`, which `CausalConv1d` takes on CUDA for latent-rate convs) and against a channels-last 2-D
conv (the NHWC layout cuDNN's Hopper kernels read) and against `triton_conv.causal_conv` in each of `CONV_TILES`
launch shapes (channels-last input, multi-tap convs; with the products' FLOPs). Times are CUDA-event medians of a
graph of 20 calls, per call.

    python3 -m loadtest.gpu.codec_ops_bench [--streams 64] [--frames 8] [--out ops.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F

from loadtest.gpu.gpu_common import graphed_us_per_call
from services.kernels.codec import fused_snake, layout, triton_conv
from services.model.codec import causal_conv
from services.model.codec.vocoder import ResidualUnit, SnakeBeta

CALLS = 20
SAMPLES_PER_FRAME = 1920
# (channels, samples per frame) of the activations the vocoder's blocks run SnakeBeta on (0.6B codec: 1536
# channels at 4 latents a frame, halved per block while upsampled 8, 5, 4, 3 times).
CONV_SHAPES = (("pre_conv", 512, 1024, 3, 1, 1), ("input", 1024, 1536, 7, 1, 4), ("block1 unit", 768, 768, 7, 1, 32),
               ("block1 unit", 768, 768, 7, 9, 32), ("block2 unit", 384, 384, 7, 3, 160),
               ("block3 unit", 192, 192, 7, 3, 640), ("block4 unit", 96, 96, 7, 3, 1920), ("output", 96, 1, 7, 1, 1920),
               ("block2 unit 1x1", 384, 384, 1, 1, 160), ("block3 unit 1x1", 192, 192, 1, 1, 640),
               ("block4 unit 1x1", 96, 96, 1, 1, 1920))
"""(name, channels in, out, taps, dilation, samples per frame) of the codec's causal convs with history."""
CONV_TILES = (triton_conv.ConvTile(128, 128, 32, 8, 3), triton_conv.ConvTile(128, 64, 32, 4, 3),
              triton_conv.ConvTile(64, 128, 64, 4, 3), triton_conv.ConvTile(128, 128, 64, 8, 3),
              triton_conv.ConvTile(256, 128, 32, 8, 3), triton_conv.ConvTile(128, 128, 32, 4, 4))
"""The Triton convolution's launch shapes timed (rows, channels, reduction step, warps, stages)."""
SNAKE_SHAPES = ((1536, 4), (768, 32), (384, 160), (192, 640), (96, 1920))


def _per_call_us(fn, device: torch.device) -> float:
    return graphed_us_per_call(fn, device, CALLS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.backends.cudnn.benchmark = True  # as the serving slot decoder sets it where it captures
    results: list[dict] = []
    for channels, per_frame in SNAKE_SHAPES:
        snake = SnakeBeta(channels).to(device, dtype)
        with torch.no_grad():
            snake.alpha.normal_(0, 0.3)
            snake.beta.normal_(0, 0.3)
        x = torch.randn((args.streams, channels, per_frame * args.frames), device=device, dtype=dtype)
        with torch.inference_mode():
            alpha, beta = snake.alpha.exp()[None, :, None], snake.beta.exp()[None, :, None]

            def torch_form() -> torch.Tensor:
                return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)

            want, got = torch_form(), snake(x)
            torch_us = _per_call_us(torch_form, device)
            fused_us = _per_call_us(lambda: fused_snake.snake_beta(x, snake.alpha, snake.beta, 1e-9), device)
        error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        results.append({"op": "snake", "channels": channels, "samples": x.shape[-1], "torch_us": torch_us,
                        "fused_us": fused_us, "max_rel_error": error})
        print(f"snake {channels:5d} ch x {x.shape[-1]:6d}: torch {torch_us:8.1f} us, fused {fused_us:8.1f} us "
              f"(error {error:.2g})", flush=True)
    for name, inputs, outputs, taps, dilation, per_frame in CONV_SHAPES:
        conv = torch.nn.Conv1d(inputs, outputs, taps, dilation=dilation).to(device, dtype)
        x = torch.randn((args.streams, inputs, per_frame * args.frames + (taps - 1) * dilation), device=device,
                        dtype=dtype)
        with torch.inference_mode():
            want = conv(x).float()
            error = float((causal_conv._as_gemm(conv, x).float() - want).abs().max() / want.abs().max())
            cudnn_us = _per_call_us(lambda: conv(x), device)
            gemm_us = _per_call_us(lambda: causal_conv._as_gemm(conv, x), device)
            # The same conv as a 2-D one over [B, C, 1, L] held channels-last (NHWC), the layout cuDNN's Hopper
            # kernels read: what the vocoder would gain if its activations stayed in that layout throughout.
            x_nhwc = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            w_nhwc = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            nhwc = lambda: F.conv2d(x_nhwc, w_nhwc, conv.bias, dilation=(1, dilation))  # noqa: E731
            nhwc_error = float((nhwc().squeeze(2).float() - want).abs().max() / want.abs().max())
            nhwc_us = _per_call_us(nhwc, device)
            triton = _triton_conv_rows(conv, x, want) if taps > 1 else []
        chosen = "gemm" if per_frame * args.frames <= causal_conv.GEMM_FORM_MAX_OUTPUTS else "cudnn"
        flops = 2 * args.streams * per_frame * args.frames * inputs * outputs * taps
        results.append({"op": "conv", "name": name, "inputs": inputs, "outputs": outputs, "taps": taps,
                        "dilation": dilation, "samples": x.shape[-1], "cudnn_us": cudnn_us, "gemm_us": gemm_us,
                        "serving_form": chosen, "max_rel_error": error, "nhwc_us": nhwc_us,
                        "nhwc_max_rel_error": nhwc_error, "flops": flops, "triton": triton})
        for row in triton:
            print(f"    triton {row['tile']}: {row['us']:8.1f} us ({flops / row['us'] / 1e6:.0f} TFLOP/s, error "
                  f"{row['max_rel_error']:.2g})", flush=True)
        print(f"conv {name:16s} {inputs:5d} -> {outputs:5d} k{taps} d{dilation} x {x.shape[-1]:6d}: cuDNN "
              f"{cudnn_us:8.1f} us, GEMM form {gemm_us:8.1f} us, NHWC {nhwc_us:8.1f} us, serving {chosen} "
              f"(errors {error:.2g}, {nhwc_error:.2g})", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "codec_ops", "streams": args.streams, "frames": args.frames,
                                        "results": results}, indent=2))
    return 0


def _triton_conv_rows(conv: torch.nn.Conv1d, x: torch.Tensor, want: torch.Tensor,
                      timer=None) -> list[dict]:
    """`triton_conv.causal_conv` over x held channels-last in each of `CONV_TILES`: us a call and the error."""
    timer = timer or _per_call_us
    x_last = layout.channels_last(x)
    rows = []
    for tile in CONV_TILES:
        def call(tile=tile) -> torch.Tensor:
            return triton_conv.causal_conv(x_last, conv.weight, conv.dilation[0], conv.bias, tile)

        error = float((call().float() - want).abs().max() / want.abs().max())
        rows.append({"tile": [tile.block_m, tile.block_n, tile.block_k, tile.num_warps, tile.num_stages],
                     "us": timer(call, x.device), "max_rel_error": error})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
