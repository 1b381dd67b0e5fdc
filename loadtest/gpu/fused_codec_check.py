"""The codec's fused passes against the torch forms on CUDA: one decode with them on and one with them off.

The 0.6B codec with random weights, 15 frames in chunks of 3, 5 and 7 (histories carried across chunks), in float32
and bfloat16; and the bias kernel against torch's sums. Writes the differences as JSON (the CPU runs the same
comparison under Triton's interpreter in tests/kernels/test_fused_codec_convs.py).

    python3 -m loadtest.gpu.fused_codec_check --out check.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from loadtest.gpu.gpu_models import add_kernel_arguments, build_codec, kernel_choices, kernels_record
from services.model.codec import vocoder
from services.kernels.codec.fused_bias import add_bias
from services.kernels.triton_support import compiles_for


def decode(decoder, codes: torch.Tensor, fused: bool, chunks: tuple[int, ...] = (3, 5, 7)) -> torch.Tensor:
    """`codes` decoded chunk by chunk (`chunks`: their frame counts; 15 frames in 3, 5 and 7 by default) with the
    vocoder's fused paths forced on or off, on any device (the CPU tests force them on under Triton's interpreter);
    the switch is put back after."""
    vocoder.compiles_for = lambda device: fused  # the one switch the fused paths read
    try:
        state, pieces, start = decoder.new_stream(), [], 0
        for size in chunks:
            pieces.append(decoder.decode_chunk(state, codes[start : start + size]).float())
            start += size
        return torch.cat(pieces)
    finally:
        vocoder.compiles_for = compiles_for


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    add_kernel_arguments(parser)
    args = parser.parse_args(argv)
    device, choices = torch.device("cuda"), kernel_choices(args)
    y = torch.randn(4, 96, 5000, device=device, dtype=torch.bfloat16)[..., 3:4003]
    bias = torch.randn(96, device=device, dtype=torch.bfloat16)
    residual = torch.randn(4, 96, 4000, device=device, dtype=torch.bfloat16)
    report = {"kernels": kernels_record(choices),
              "add_bias_bf16_mismatches": int((add_bias(y, bias, residual) != residual + (y + bias[None, :, None])).sum())}
    for dtype in (torch.float32, torch.bfloat16):
        decoder = build_codec("0.6b", device, dtype, choices=choices)
        codes = torch.randint(0, decoder.config.codebook_size, (15, decoder.config.num_quantizers), device=device)
        plain, fused = decode(decoder, codes, False), decode(decoder, codes, True)
        report[str(dtype)] = {"max_abs_diff": float((fused - plain).abs().max()), "peak": float(plain.abs().max()),
                              "rms_diff_over_std": float((fused - plain).pow(2).mean().sqrt() / plain.std())}
    print(json.dumps(report, indent=1))
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
