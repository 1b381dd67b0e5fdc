"""The fused add + norm + projection kernel's block choices against what it replaces, at a decode step's shapes.

For each shape (the 0.6B's q/k/v projection and gated MLP, 1024 wide, at a step's rows) and each `Blocks` choice,
the kernel's time per launch, against the unfused path the layers take otherwise (`add_rms_norm`, the GEMM library's
projection, and `silu_mul` for the MLP). Each is timed as a CUDA graph of 20 launches replayed (`do_bench_cudagraph`),
so host launch cost is out and each launch's device time and the gaps between launches are in, as in the engine's
graphs. The kernel is worth turning on (`VOXMESH_FUSED_NORM_LINEAR=1`, with the winning blocks as `DEFAULT_BLOCKS`)
only where it beats the unfused path at every shape a step has.

    python3 -m loadtest.gpu.fused_norm_linear_sweep --out sweep.json [--rows 1 64 128] [--quick]

On the CPU (`--device cpu`, float32, under TRITON_INTERPRET=1) it runs one tiny shape, to check the script itself.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from loadtest.gpu.gpu_micro import environment
from services.model.fused_norm_linear import Blocks, add_norm_linear
from services.model.fused_rms_norm import add_rms_norm
from services.model.fused_silu_mul import silu_mul

LAUNCHES = 20
"""Launches in one timed graph: the time per launch is the replay's over this."""

PROJECTIONS = {"qkv": (4096, False), "gate_up": (3072, True)}
"""Output width and gating of the two projections the kernel replaces in a 0.6B layer (talker and code predictor)."""

TINY_PROJECTIONS = {"qkv": (48, False), "gate_up": (40, True)}
"""The CPU check's: 1024-wide projections would take minutes under the interpreter."""


def choices(quick: bool) -> list[Blocks]:
    if quick:
        return [Blocks(block_n, block_k, warps, stages)
                for block_n, block_k, warps, stages in itertools.product((32, 64), (128,), (4,), (3, 4))]
    return [Blocks(block_n, block_k, warps, stages)
            for block_n, block_k, warps, stages in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (2, 3, 4))]


def per_launch_ms(fn, device: torch.device) -> float:
    """Device time per launch of `fn`, from a graph of LAUNCHES calls (on the CPU: plain wall time per call)."""
    def repeated():
        for _ in range(LAUNCHES):
            fn()

    if device.type != "cuda":
        repeated()
        begin = time.perf_counter()
        repeated()
        return 1000 * (time.perf_counter() - begin) / LAUNCHES
    import triton.testing
    return triton.testing.do_bench_cudagraph(repeated, rep=50) / LAUNCHES


def inputs(rows: int, width: int, out_width: int, gated: bool, device: torch.device, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(rows)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(shape, generator=generator)).to(device, dtype)

    return (rand(rows, width), rand(rows, width), rand(width),
            rand(2 * out_width if gated else out_width, width, scale=width**-0.5))


def sweep_shape(rows: int, width: int, name: str, out_width: int, gated: bool, device: torch.device,
                dtype: torch.dtype, blocks: list[Blocks]) -> dict:
    x, delta, norm_weight, weight = inputs(rows, width, out_width, gated, device, dtype)

    def unfused():
        _, normed = add_rms_norm(x, delta, norm_weight, 1e-6)
        projected = F.linear(normed, weight)
        return silu_mul(projected) if gated else projected

    expected = unfused().float()
    row = {"rows": rows, "projection": name, "unfused_ms": per_launch_ms(unfused, device), "choices": []}
    for choice in blocks:
        def fused(choice=choice):
            return add_norm_linear(x, delta, norm_weight, 1e-6, weight, gated=gated, blocks=choice)[1]

        try:
            error = float((fused().float() - expected).abs().max() / expected.abs().max())
            row["choices"].append({**_fields(choice), "ms": per_launch_ms(fused, device), "rel_error": error})
        except Exception as exc:  # noqa: BLE001 - a choice that does not compile (shared memory, say) is reported
            row["choices"].append({**_fields(choice), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    timed = [c for c in row["choices"] if "ms" in c]
    row["best"] = min(timed, key=lambda c: c["ms"]) if timed else None
    return row


def _fields(choice: Blocks) -> dict:
    return {"block_n": choice.block_n, "block_k": choice.block_k, "num_warps": choice.num_warps,
            "num_stages": choice.num_stages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 128])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="four choices instead of 54")
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    dtype, width = (torch.bfloat16, 1024) if on_gpu else (torch.float32, 64)
    rows = args.rows if on_gpu else [3]
    blocks = choices(args.quick) if on_gpu else [Blocks(16, 32, 4, 1)]
    projections = PROJECTIONS if on_gpu else TINY_PROJECTIONS
    results = [sweep_shape(r, width, name, *projections[name], device, dtype, blocks)
               for r in rows for name in projections]
    args.out.write_text(json.dumps({"benchmark": "fused_norm_linear_sweep", "dtype": str(dtype), "width": width,
                                    "launches_per_graph": LAUNCHES, "environment": environment(device, args.commit),
                                    "results": results}, indent=2))
    print("| rows | projection | unfused us | best fused us | best blocks (n, k, warps, stages) |")
    print("|---|---|---|---|---|")
    for row in results:
        best = row["best"]
        shown = "-" if best is None else f"{1000 * best['ms']:.1f}"
        choice = "-" if best is None else (f"{best['block_n']}, {best['block_k']}, {best['num_warps']}, "
                                           f"{best['num_stages']}")
        print(f"| {row['rows']} | {row['projection']} | {1000 * row['unfused_ms']:.1f} | {shown} | {choice} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
