"""The code predictor's fused attention at the serving shapes, per choice of warps a program: which one the
kernel should launch with (`fused_small_attention.NUM_WARPS`).

    python3 -m experiments.small_attention_warps [--rows 64] [--out warps.json]

Shapes are the 0.6B code predictor's (16 query heads, 8 kv heads, head_dim 128, a 16-entry cache); one frame's
chain is a first step of two tokens then 14 of one, each step kind timed as the CUDA-event median of a graph of 100
launches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from loadtest.gpu.gpu_common import checked_launch_us, keep, write_sweep
from services.kernels import fused_small_attention
from services.model import small_attention


LAUNCHES = 100
"""Launches captured in one graph and replayed together: the per-launch time as the serving graphs see it."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    heads, kv_heads, head_dim, max_len = 16, 8, 128, 16
    results = []
    for rows in args.rows:
        cache = torch.randn((2, rows, kv_heads, max_len, head_dim), device=device, dtype=dtype)
        for num_new, start in ((2, 0), (1, 8)):
            q = torch.randn((rows, num_new, heads, head_dim), device=device, dtype=dtype)
            k, v = (torch.randn((rows, num_new, kv_heads, head_dim), device=device, dtype=dtype) for _ in range(2))
            want = small_attention.torch_form(cache.clone(), start, q, k, v, head_dim**-0.5)
            for warps in args.warps:
                # The new entries' cache writes repeat the same values: every launch of the graph computes the same.
                error, per_launch_us = checked_launch_us(lambda: fused_small_attention.small_attention(
                    cache, start, q, k, v, head_dim**-0.5, warps), want, device, LAUNCHES)
                keep(results, {"rows": rows, "new": num_new, "start": start, "warps": warps,
                               "median_us": per_launch_us, "max_abs_error": error},
                     f"rows {rows:3d} new {num_new} start {start:2d} warps {warps}: {per_launch_us:7.2f} us "
                     f"(error {error:.3g})")
    write_sweep(args.out, "small_attention_warps", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
