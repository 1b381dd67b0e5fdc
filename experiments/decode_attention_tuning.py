"""The talker's paged decode attention at the serving shapes, per launch choice: which `block_n` (cache entries a
loop step reads) and `num_warps` the kernel should launch with (`triton_decode.decode_attention`).

    python3 -m experiments.decode_attention_tuning [--rows 64] [--context 64 128 256 512] [--out tuning.json]

Why: at batch 64 the talker graph's 28 `_decode_kernel` launches took 434 us of its 1.41 ms on an H200 (15.5 us a
launch, `step_split_h200_2026-12-02_e3a7e0d.json`), where the bytes they read (64 sequences of ~130 cached tokens,
8 kv heads of 128, bf16 K and V) take ~3 us at the card's bandwidth: the loop's steps wait on each other's loads.
Shapes are the 0.6B talker's (16 query heads, 8 kv heads, head_dim 128, blocks of 16 tokens, scattered); each
choice is checked against a dense torch attention over the same cache, then timed as the CUDA-event median of a
graph of 100 launches, beside the time its bytes take at 4.3 TB/s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.nn import functional as F

from loadtest.gpu.gpu_common import checked_launch_us, keep, write_sweep
from services.kernels.triton_decode import decode_attention

LAUNCHES = 100
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, LAYERS = 16, 8, 128, 16, 2
BANDWIDTH_BYTES_PER_US = 4.3e6
"""The H200's HBM bandwidth (4.3 TB/s) in bytes per microsecond."""


def _case(rows: int, context: int, device: torch.device, dtype: torch.dtype) -> dict:
    """A scattered pool holding `context` cached tokens per row (the last one the new token's), tables, lengths, q."""
    blocks_per_row = -(-context // BLOCK_SIZE)
    generator = torch.Generator().manual_seed(rows * 1000 + context)
    tables = torch.randperm(rows * blocks_per_row + 8, generator=generator)[: rows * blocks_per_row]
    pool = torch.randn((rows * blocks_per_row + 8, LAYERS, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM), generator=generator)
    q = torch.randn((rows, HEADS, HEAD_DIM), generator=generator)
    return {"pool": pool.to(device, dtype), "tables": tables.view(rows, blocks_per_row).to(device),
            "seq_lens": torch.full((rows,), context, dtype=torch.int32, device=device), "q": q.to(device, dtype)}


def _dense(case: dict, layer: int, scale: float) -> torch.Tensor:
    """Each row's cached keys and values gathered in order, then SDPA over them: the kernel's oracle."""
    pool, tables, q = case["pool"], case["tables"], case["q"]
    length = int(case["seq_lens"][0])
    keys = pool[tables, layer, 0].flatten(1, 2)[:, :length]  # [rows, length, kv_heads, D]
    values = pool[tables, layer, 1].flatten(1, 2)[:, :length]
    out = F.scaled_dot_product_attention(q[:, :, None].float(), keys.transpose(1, 2).float(),
                                         values.transpose(1, 2).float(), scale=scale, enable_gqa=True)
    return out[:, :, 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device, dtype, scale, layer = torch.device("cuda"), torch.bfloat16, HEAD_DIM**-0.5, 1
    results = []
    for rows in args.rows:
        for context in args.context:
            case = _case(rows, context, device, dtype)
            want = _dense(case, layer, scale)
            floor_us = rows * context * KV_HEADS * HEAD_DIM * 2 * 2 / BANDWIDTH_BYTES_PER_US
            for block_n in args.block_n:
                for warps in args.warps:
                    def call(block_n=block_n, warps=warps) -> torch.Tensor:
                        return decode_attention(case["q"], case["pool"], layer, case["tables"], case["seq_lens"],
                                                scale, block_n=block_n, num_warps=warps)

                    error, us = checked_launch_us(call, want, device, LAUNCHES)
                    keep(results, {"rows": rows, "context": context, "block_n": block_n, "warps": warps,
                                   "median_us": us, "floor_us": floor_us, "max_abs_error": error},
                         f"rows {rows:3d} context {context:4d} block_n {block_n:3d} warps {warps}: {us:7.2f} us "
                         f"(floor {floor_us:5.2f}, error {error:.3g})")
    write_sweep(args.out, "decode_attention_tuning", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
