"""What a captured graph's first replay costs against its later ones, and what a talker step costs by token bucket.

Builds a preset's model (random weights, in memory) and an engine as decode does (every graph captured at start-up,
`--max-num-seqs` rows), then, before any step has run, replays each talker graph (one per token bucket) and each
sampling graph (one per rows bucket and sampling mode) once, timed with CUDA events around the call, then again
(median of `--reps`). A first replay much slower than the rest is a cost the first requests to reach that shape
pay: in the mesh, a step that stalls every stream in it. The talker's per-bucket times also say what a prompt's
prefill chunk adds to a step (a decode step of 64 rows takes the 64-token bucket; with a 40-token chunk, the 128).

    python3 -m experiments.first_replay --out first_replay.json [--preset 0.6b] [--max-num-seqs 64] \
        [--without-warm-replay]

`--without-warm-replay` leaves out the replay `services.model.cuda_graph.capture` makes of every graph it captures
(what capture did before 979a2b5), so the first replays timed here are the graphs' very first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from loadtest.gpu.gpu_common import time_call
from loadtest.gpu.gpu_micro import DTYPES, environment
from loadtest.gpu.gpu_models import build_model, write_config_files
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.model import cuda_graph


@contextmanager
def without_warm_replays():
    """Inside: `cuda_graph.capture` captures as usual but skips its one replay (the graph is launched first later)."""
    real_replay, real_capture, capturing = torch.cuda.CUDAGraph.replay, cuda_graph.capture, [False]

    def replay(graph):
        if not capturing[0]:
            real_replay(graph)

    def capture(*args, **kwargs):
        capturing[0] = True
        try:
            return real_capture(*args, **kwargs)
        finally:
            capturing[0] = False

    torch.cuda.CUDAGraph.replay, cuda_graph.capture = replay, capture
    try:
        yield
    finally:
        torch.cuda.CUDAGraph.replay, cuda_graph.capture = real_replay, real_capture


def first_ms(fn, device: torch.device) -> float:
    """One call of `fn`, timed on the device (CUDA events around it)."""
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def measure(engine: Engine, reps: int) -> list[dict]:
    runner, device = engine.runner, engine.model.device
    graphs = [(f"talker {tokens} tokens", bucket.step) for tokens, bucket in sorted(runner.talker_step.prepared.items())]
    graphs += [(f"sampler {key}", step) for key, step in runner.frame_sampler.graphs.items()]
    rows = []
    for name, step in graphs:
        first = first_ms(step, device)
        rows.append({"graph": name, "first_ms": first, "then_median_ms": time_call(step, device, 0, reps)["median_ms"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--kv-cache-blocks", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--without-warm-replay", action="store_true")
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as scratch:
        model = build_model(write_config_files(Path(scratch) / args.preset, args.preset), device, DTYPES[args.dtype])
    started = time.perf_counter()
    with without_warm_replays() if args.without_warm_replay else nullcontext():
        engine = Engine(model, EngineConfig(kv_cache_blocks=args.kv_cache_blocks, max_num_seqs=args.max_num_seqs))
    capture_s = time.perf_counter() - started
    rows = measure(engine, args.reps)
    args.out.write_text(json.dumps({"benchmark": "first_replay", "preset": args.preset, "dtype": args.dtype,
                                    "warm_replay_at_capture": not args.without_warm_replay,
                                    "environment": environment(device, args.commit), "engine_build_s": capture_s,
                                    "results": rows}, indent=2) + "\n")
    print(f"engine built (graphs captured) in {capture_s:.1f} s")
    print("| graph | first replay ms | later replays, median ms |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row['graph']} | {row['first_ms']:.2f} | {row['then_median_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
