"""The engine's step loop with a preset's shapes (0.6B by default) on a device: `engine_step_bench` on a model
built in memory (random bf16 weights, `gpu_models`), so no checkpoint has to be written first.

The measuring is `loadtest.gpu.engine_step_bench.bench_batch` unchanged (steps/s, frames/s, host-time split);
this module only supplies the model and the tokenizer and records where and what it ran.

    python -m experiments.gpu_engine --out engine.json --device cuda [--preset 0.6b] [--batch-sizes 1 8 32 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from loadtest.gpu.engine_step_bench import bench_batch, instrumented
from loadtest.gpu.gpu_micro import DTYPES, environment
from loadtest.gpu.gpu_models import build_in_memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model, tokenizer = build_in_memory(args.preset, device, DTYPES[args.dtype])
    with instrumented(model) as timers:
        results = [bench_batch(model, tokenizer, timers, batch, args.steps, args.warmup) for batch in args.batch_sizes]
    report = {"benchmark": "gpu_engine (engine_step_bench.bench_batch)", "preset": args.preset, "dtype": args.dtype,
              "weights": "random, in memory", "environment": environment(device, args.commit),
              "steps": args.steps, "warmup": args.warmup, "results": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in results:
        print(f"engine {args.preset} batch {row['batch']:3d}: {row['step_ms']:8.2f} ms/step, "
              f"{row['frames_per_s']:8.1f} frames/s, outside forward {100 * row['outside_forward_share']:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
