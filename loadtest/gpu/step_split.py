"""Where a graphed engine step's device time goes: the talker graph and the frame-sampling graph, timed apart.

Builds a preset's model (random weights, in memory), an engine with CUDA graphs at the engine's default limits,
admits B fixed-length requests, runs a few steps, then replays the talker graph of the B-token bucket and the
sampling graph of the B-row bucket on their own, each timed with CUDA events (median of `--reps`), and counts the
kernels of one replay of each with the torch profiler.

    python3 -m loadtest.gpu.step_split --out split.json [--preset 0.6b] [--batch-sizes 1 8 32 64] [--gated-gemm false]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from loadtest.gpu.engine_step_bench import TEXT
from loadtest.gpu.gpu_common import count_launches, time_call, top_kernels
from loadtest.gpu.gpu_micro import DTYPES, environment
from loadtest.gpu.gpu_models import (add_kernel_arguments, build_model, build_tokenizer, kernel_choices,
                                     kernels_record, write_config_files)
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_request import EngineRequest
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams


def split(model, tokenizer, batch: int, reps: int) -> dict:
    engine = Engine(model, EngineConfig(kv_cache_blocks=batch * 20 + 64, max_num_seqs=64))
    ids = tuple(tokenizer.encode(assistant_text(TEXT)))
    for index in range(batch):
        request = PromptRequest(ids, speaker="ryan", language="english", non_streaming=False)
        engine.add_request(EngineRequest(
            f"r{index}", request, seed=index, params=SamplingParams(), max_new_frames=40, ignore_eos=True))
    for _ in range(4):
        engine.step()  # prefill, then decode steps: every graph below has run
    runner = engine.runner
    talker = runner.talker_step.prepared[runner.talker_step.bucket_of(batch)].step
    # The graph the engine's last step replayed: the default requests' (the fused draws where they serve).
    sampler = next(reversed(runner.frame_sampler.graphs.values()))
    device = model.device

    def median_ms(fn) -> float:
        return time_call(fn, device, warmup=2, reps=reps)["median_ms"]

    return {"batch": batch, "talker_ms": median_ms(talker), "sampler_ms": median_ms(sampler),
            "engine_step_ms": median_ms(engine.step), "talker_kernels": count_launches(talker, device)["cuda_kernels"],
            "sampler_kernels": count_launches(sampler, device)["cuda_kernels"],
            "talker_top_kernels": top_kernels(talker, device), "sampler_top_kernels": top_kernels(sampler, device)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--commit")
    add_kernel_arguments(parser)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    choices = kernel_choices(args)
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_config_files(Path(scratch) / args.preset, args.preset)
        model, tokenizer = build_model(directory, device, DTYPES[args.dtype], choices=choices), build_tokenizer(directory)
    rows = [split(model, tokenizer, batch, args.reps) for batch in args.batch_sizes]
    args.out.write_text(json.dumps({"benchmark": "step_split", "preset": args.preset, "dtype": args.dtype,
                                    "environment": environment(device, args.commit),
                                    "kernels": kernels_record(choices, model), "results": rows}, indent=2))
    print("| batch | talker graph ms (kernels) | sampling graph ms (kernels) | engine step ms |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['batch']} | {row['talker_ms']:.2f} ({row['talker_kernels']}) | {row['sampler_ms']:.2f} "
              f"({row['sampler_kernels']}) | {row['engine_step_ms']:.2f} |")
    for graph in ("talker", "sampler"):
        print(f"{graph} graph at batch {rows[-1]['batch']}, kernels by device time:")
        for entry in rows[-1][f"{graph}_top_kernels"][:12]:
            print(f"  {entry['total_us']:9.1f} us {entry['count']:5d}x {entry['kernel']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
