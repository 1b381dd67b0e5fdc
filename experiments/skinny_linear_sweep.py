"""The skinny-GEMM kernel (`services/model/skinny_linear.py`) against cuBLAS for the engine's projections, weights cold.

For each (out, in) weight shape the talker and the code predictor multiply by, and each row count: `--layers` distinct
weights of that shape (more bytes than the card's 50-MB L2 holds, so every call streams its weight from HBM, as in a
step where each layer reads its own) are multiplied in turn inside one CUDA graph; the replay's time divided by the
calls is one projection as a serving graph sees it. cuBLAS (`F.linear`) first, then every kernel launch shape of the
sweep at the most rows (the best five at fewer), each checked against
cuBLAS's output. The weight-read floor is the weight's bytes at the card's copy rate.

    python3 -m experiments.skinny_linear_sweep --out sweep.json [--rows 64 16 1] [--commit C]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from triton.runtime.errors import OutOfResources

from loadtest.gpu.gpu_common import graphed_us_per_call, measure_ceilings
from loadtest.gpu.gpu_micro import environment
from services.kernels.skinny_linear import SkinnyConfig, fits, launch

SHAPES = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 1024), (3072, 1024))
"""The 0.6B engine's projections: fused q/k/v, o_proj, fused gate/up, down_proj, a predictor head, the codec head."""
COLD_BYTES = 200 << 20
"""Weight bytes a graph cycles through: four times the H200's L2."""


def candidate_configs(out_features: int, in_features: int) -> list[SkinnyConfig]:
    splits = (1, 2, 4, 8) if out_features <= 2048 else (1, 2)
    configs = []
    for block_n, block_k, split_k, stages in itertools.product((32, 64, 128), (128, 256), splits, (3, 4)):
        config = SkinnyConfig(block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=stages)
        if out_features % block_n == 0 and in_features % (split_k * block_k) == 0:
            configs.append(config)
    return configs


def cycled(fn, weights: list[torch.Tensor]):
    position = [0]

    def call():
        weight = weights[position[0] % len(weights)]
        position[0] += 1
        return fn(weight)
    return call


def sweep_shape(shape: tuple[int, int], rows_list: list[int], device: torch.device, floor_us: float) -> list[dict]:
    out_features, in_features = shape
    count = max(4, COLD_BYTES // (out_features * in_features * 2))
    generator = torch.Generator(device=device).manual_seed(0)
    weights = [torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator) * in_features**-0.5
               for _ in range(count)]
    results, shortlist = [], None
    for rows in sorted(rows_list, reverse=True):  # every launch shape at the most rows, the best five at fewer
        x = torch.randn((rows, in_features), device=device, dtype=torch.bfloat16, generator=generator)
        expected = F.linear(x, weights[0]).float()
        entry = {"out": out_features, "in": in_features, "rows": rows, "floor_us": round(floor_us, 2),
                 "cublas_us": round(graphed_us_per_call(cycled(lambda w: F.linear(x, w), weights), device,
                                                        calls=count), 2), "configs": []}
        for config in shortlist or candidate_configs(out_features, in_features):
            if not fits(x, weights[0], config):
                continue
            try:
                got = launch(x, weights[0], config).float()
            except OutOfResources:  # a tile too large for the card's shared memory at this many stages
                continue
            error = float((got - expected).abs().max() / expected.abs().max())
            us = graphed_us_per_call(cycled(lambda w, c=config: launch(x, w, c), weights), device, calls=count)
            entry["configs"].append({**dataclasses.asdict(config), "us": round(us, 2), "rel_error": error})
        entry["configs"].sort(key=lambda c: c["us"])
        shortlist = [SkinnyConfig(**{key: c[key] for key in ("block_n", "block_k", "split_k", "num_warps",
                                                             "num_stages")}) for c in entry["configs"][:5]]
        results.append(entry)
        best = entry["configs"][0] if entry["configs"] else None
        print(f"| {out_features} x {in_features} | {rows} | {entry['floor_us']} | {entry['cublas_us']} | "
              + (f"{best['us']} | n{best['block_n']} k{best['block_k']} s{best['split_k']} st{best['num_stages']} "
                 f"| {best['rel_error']:.1e} |" if best else "- | - | - |"), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 16, 1])
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    copy_bytes_per_s = measure_ceilings(device, copy_bytes=1 << 30, gemm_size=4096)["copy_bandwidth_bytes_per_s"]
    print("| out x in | rows | weight-read floor us | cuBLAS us | kernel us (best) | launch shape | rel error |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for shape in SHAPES:
        floor_us = shape[0] * shape[1] * 2 / copy_bytes_per_s * 1e6
        results += sweep_shape(shape, args.rows, device, floor_us)
        args.out.write_text(json.dumps({"benchmark": "skinny_linear_sweep", "copy_bytes_per_s": copy_bytes_per_s,
                                        "environment": environment(device, args.commit), "results": results},
                                       indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
