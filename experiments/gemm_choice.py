"""Which GEMM library serves the engine's projections fastest: every distinct weight shape of a preset's talker and code
predictor, at the row counts a step runs, timed as a serving graph sees it, under cuBLAS (torch's default on CUDA),
cuBLASLt (`torch.backends.cuda.preferred_blas_library`) and TunableOp (each shape tuned over the libraries' algorithms
first), against the floor of reading the weight once at the card's copy bandwidth.

At 64 rows a step's GEMMs read far more weight bytes than they compute with, so each is bound by how fast its kernel
streams the weight; the library's choice of kernel for a small M decides that (loadtest/results/history-gpu-*.md: the q/k/v GEMM
at 64 rows ran at ~1.3 TB/s of the card's ~4.2).

    python3 -m experiments.gemm_choice --out gemm.json [--preset 0.6b] [--rows 1 64 128 256] [--commit C]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from loadtest.gpu.gpu_common import graphed_us_per_call, measure_ceilings
from loadtest.gpu.gpu_micro import environment
from loadtest.gpu.gpu_models import build_model, write_config_files

CALLS_PER_GRAPH = 50
LIBRARIES = ("cublas", "cublaslt", "tunable")


def weight_shapes(model) -> dict[tuple[int, int], list[str]]:
    """Each distinct 2-D projection weight (out, in) the engine multiplies by, with the names that have it (the fused
    q/k/v and gate/up weights included, their parts left out: the engine runs the fused ones)."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for part, module in (("talker", model.talker), ("predictor", model.code_predictor)):
        for name, sub in module.named_modules():
            fused = [getattr(sub, attribute, None) for attribute in ("qkv", "gate_up")]
            for weight in fused:
                if isinstance(weight, tuple):
                    weight = weight[0]
                if isinstance(weight, torch.Tensor) and weight.dim() == 2:
                    shapes.setdefault(tuple(weight.shape), []).append(f"{part}.{name}")
            if isinstance(sub, torch.nn.Linear) and not _is_fused_part(name):
                shapes.setdefault(tuple(sub.weight.shape), []).append(f"{part}.{name}")
    return shapes


def _is_fused_part(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def time_library(library: str, shape: tuple[int, int], rows: int, device: torch.device, dtype: torch.dtype) -> float:
    weight = torch.randn(shape, device=device, dtype=dtype) * 0.02
    x = torch.randn((rows, shape[1]), device=device, dtype=dtype)
    out = torch.empty((rows, shape[0]), device=device, dtype=dtype)
    tunable = torch.cuda.tunable
    tunable.enable(library == "tunable")
    tunable.tuning_enable(library == "tunable")
    torch.backends.cuda.preferred_blas_library("cublaslt" if library == "cublaslt" else "cublas")
    try:
        F.linear(x, weight)  # TunableOp tunes at a shape's first call, outside any capture
        torch.cuda.synchronize(device)
        return graphed_us_per_call(lambda: torch.matmul(x, weight.t(), out=out), device, CALLS_PER_GRAPH)
    finally:
        tunable.enable(False)
        torch.backends.cuda.preferred_blas_library("cublas")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 128, 256])
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.cuda.tunable.set_filename(str(args.out.with_suffix(".tunableop.csv")))
    with tempfile.TemporaryDirectory() as scratch:
        model = build_model(write_config_files(Path(scratch) / args.preset, args.preset), device, dtype)
    shapes = weight_shapes(model)
    del model
    copy_gb_s = measure_ceilings(device, copy_bytes=1 << 30, gemm_size=4096)["copy_bandwidth_bytes_per_s"] / 1e9
    results = []
    for shape, names in sorted(shapes.items()):
        floor_us = shape[0] * shape[1] * 2 / (copy_gb_s * 1e3)
        for rows in args.rows:
            entry = {"out": shape[0], "in": shape[1], "rows": rows, "used_by": names, "floor_us": round(floor_us, 2)}
            for library in args.libraries:
                entry[f"{library}_us"] = round(time_library(library, shape, rows, device, dtype), 2)
            results.append(entry)
    args.out.write_text(json.dumps({"benchmark": "gemm_choice", "preset": args.preset, "copy_gb_s": copy_gb_s,
                                    "environment": environment(device, args.commit), "results": results}, indent=1))
    print(f"| out x in | rows | uses | weight-read floor us | " + " | ".join(f"{lib} us" for lib in args.libraries) + " |")
    print("|---|---|---|---|" + "---|" * len(args.libraries))
    for entry in results:
        print(f"| {entry['out']} x {entry['in']} | {entry['rows']} | {len(entry['used_by'])} | {entry['floor_us']} | "
              + " | ".join(str(entry[f"{lib}_us"]) for lib in args.libraries) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
