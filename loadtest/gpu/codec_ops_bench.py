"""The vocoder's two costliest operations at serving shapes, in their torch and their CUDA forms: SnakeBeta (torch
expression against `fused_snake.snake_beta`) and the last conv (96 -> 1 channel, k=7) as cuDNN runs it against the
zero-padded form `CausalConv1d` uses on CUDA. Times are CUDA-event medians of a graph of 20 calls, per call.

    python3 -m loadtest.gpu.codec_ops_bench [--streams 64] [--frames 8] [--out ops.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F

from loadtest.gpu.gpu_common import time_call
from services.model.codec import causal_conv, fused_snake
from services.model.codec.vocoder import SnakeBeta

CALLS = 20
SAMPLES_PER_FRAME = 1920
# (channels, samples per frame) of the activations the vocoder's blocks run SnakeBeta on (0.6B codec: 1536
# channels at 4 latents a frame, halved per block while upsampled 8, 5, 4, 3 times).
SNAKE_SHAPES = ((1536, 4), (768, 32), (384, 160), (192, 640), (96, 1920))


def _per_call_us(fn, device: torch.device) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return time_call(graph.replay, device, warmup=3, reps=15)["median_ms"] * 1000 / CALLS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    results: list[dict] = []
    for channels, per_frame in SNAKE_SHAPES:
        snake = SnakeBeta(channels).to(device, dtype)
        with torch.no_grad():
            snake.alpha.normal_(0, 0.3)
            snake.beta.normal_(0, 0.3)
        x = torch.randn((args.streams, channels, per_frame * args.frames), device=device, dtype=dtype)
        with torch.inference_mode():
            want = (x + (1.0 / (snake.beta.exp()[None, :, None] + 1e-9)) * torch.sin(x * snake.alpha.exp()[None, :, None]).pow(2))
            got = snake(x)
            torch_us = _per_call_us(lambda: x + (1.0 / (snake.beta.exp()[None, :, None] + 1e-9))
                                    * torch.sin(x * snake.alpha.exp()[None, :, None]).pow(2), device)
            fused_us = _per_call_us(lambda: fused_snake.snake_beta(x, snake.alpha, snake.beta, 1e-9), device)
        error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        results.append({"op": "snake", "channels": channels, "samples": x.shape[-1], "torch_us": torch_us,
                        "fused_us": fused_us, "max_rel_error": error})
        print(f"snake {channels:5d} ch x {x.shape[-1]:6d}: torch {torch_us:8.1f} us, fused {fused_us:8.1f} us "
              f"(error {error:.2g})", flush=True)
    conv = torch.nn.Conv1d(96, 1, 7).to(device, dtype)
    x = torch.randn((args.streams, 96, SAMPLES_PER_FRAME * args.frames + 6), device=device, dtype=dtype)
    with torch.inference_mode():
        error = float((causal_conv._padded_outputs(conv, x).float() - conv(x).float()).abs().max())
        plain_us = _per_call_us(lambda: conv(x), device)
        padded = {}
        for outputs in (8, 16, 32):
            causal_conv.NARROW_OUTPUTS = outputs
            padded[outputs] = _per_call_us(lambda: causal_conv._padded_outputs(conv, x), device)
    results.append({"op": "last_conv", "samples": x.shape[-1], "plain_us": plain_us, "padded_us": padded,
                    "max_abs_error": error})
    print(f"last conv 96 -> 1 x {x.shape[-1]}: cuDNN as is {plain_us:8.1f} us; padded to 8/16/32 outputs "
          + " / ".join(f"{us:.1f}" for us in padded.values()) + f" us (error {error:.2g})", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "codec_ops", "streams": args.streams, "frames": args.frames,
                                        "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
