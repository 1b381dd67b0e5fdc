"""The whole engine decode step, eager vs CUDA graphs, at several batch sizes, with the codes checked equal.

Two engines over one model (a preset's shapes, random weights, built in memory by `gpu_models`): `eager`
with `EngineConfig.cuda_graphs` off, `graphs` with it on (the talker's decode step from
services/engine/talker_graphs.py, the frame sampling and the code predictor's 15 steps from
services/engine/predictor_graphs.py). Each admits B requests (engine-default sampling: top-k 50,
T 0.9; distinct seeds; EOS ignored), prefills them, then times `warmup` + `steps` decode steps, one
`Engine.step()` each (host work, the copy of the codes to the host and so the device wait included).
Every frame either engine made, prefill steps included, is compared code for code. Without CUDA the
`graphs` engine runs the same padded, static-buffer steps eagerly (the CPU smoke run).

The engines' codes can differ only where the two paths compute differently: the talker graph reads a
bucket's block columns (masked), the eager talker its batch's own. So the frame sampler is also checked
alone (`sampler_equal`): the same random inputs (mixed greedy, top-k, top-p and whole-vocabulary rows)
through `PaddedFrameSampler` (captured on CUDA) and through eager `model_ops.sample_frames`, bit for bit.

    python -m loadtest.gpu.gpu_step_graphs --out step_graphs.json [--device cuda] [--batch-sizes 1 8 32 64]
    python -m loadtest.gpu.gpu_step_graphs --out /tmp/x.json --device cpu --tiny    (the CPU smoke run)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

from loadtest.gpu.engine_step_bench import TEXT
from loadtest.gpu.gpu_micro import DTYPES, Report, add_model_arguments, environment, settle_model_arguments
from loadtest.gpu.gpu_models import (add_kernel_arguments, build_model, build_tokenizer, kernel_choices,
                                     kernels_record, write_config_files)
from services.engine.config import EngineConfig
from services.engine.talker_graphs import TalkerGraphSpec
from services.engine.engine import Engine
from services.engine.model_ops import sample_frames
from services.engine.predictor_graphs import PaddedFrameSampler
from services.engine.runner import ModelRunner
from services.engine.engine_request import EngineRequest
from services.model.loader import TTSModel
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import RowSampling, SamplingParams
from services.model.text_tokenizer import TextTokenizer

BLOCK_SIZE = 16
SPEAKERS = ("ryan", "vivian", "eric")


def _engine(model: TTSModel, batch: int, max_frames: int, prompt_len: int, graphs: bool) -> Engine:
    """An engine sized for `batch` requests; `graphs` on a CPU model runs the padded steps eagerly."""
    blocks = batch * -(-(prompt_len + max_frames + 1) // BLOCK_SIZE)
    config = EngineConfig(kv_cache_blocks=blocks, block_size=BLOCK_SIZE, max_num_seqs=max(64, batch),
                          max_num_batched_tokens=max(2048, batch), cuda_graphs=graphs)
    engine = Engine(model, config)
    if graphs and model.device.type != "cuda":
        spec = TalkerGraphSpec(config.max_num_seqs, -(-config.max_model_len // BLOCK_SIZE),
                               config.max_num_batched_tokens, capture=False)
        engine.runner = ModelRunner(model, engine.num_blocks, BLOCK_SIZE, graphs=spec)
    return engine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_engine(model: TTSModel, tokenizer: TextTokenizer, batch: int, steps: int, warmup: int,
               graphs: bool) -> dict:
    """Codes of every request ([frames, 16]) and the wall time (ms) of each timed decode step."""
    ids = tuple(tokenizer.encode(assistant_text(TEXT)))
    max_frames = warmup + steps + 8
    engine = _engine(model, batch, max_frames, len(ids) + 64, graphs)
    for index in range(batch):
        request = PromptRequest(ids, speaker=SPEAKERS[index % 3], language="english", non_streaming=False)
        engine.add_request(EngineRequest(
            f"r{index}", request, seed=1000 + index, params=SamplingParams(), max_new_frames=max_frames,
            ignore_eos=True))
    codes: dict[str, list[torch.Tensor]] = {}
    samples: list[float] = []
    prefill_steps = 0
    while len(codes) < batch:  # prefill (maybe chunked) until every request has its first frame
        _collect(engine.step(), codes)
        prefill_steps += 1
    for index in range(warmup + steps):
        _sync(model.device)
        begin = time.perf_counter()
        out = engine.step()
        elapsed = 1000 * (time.perf_counter() - begin)
        if len(out.frames) != batch:
            raise RuntimeError(f"decode step {index} made {len(out.frames)} frames for {batch} requests")
        _collect(out, codes)
        if index >= warmup:
            samples.append(elapsed)
    runner = engine.runner
    result = {"codes": {rid: torch.stack(frames) for rid, frames in codes.items()}, "samples": samples,
              "prefill_steps": prefill_steps,
              "talker_buckets": sorted(runner.talker_step.prepared) if runner.talker_step else [],
              "sampler_buckets": sorted({key[0] for key in runner.frame_sampler.graphs}) if runner.frame_sampler else []}
    for request_id in list(codes):
        engine.abort_request(request_id)
    return result


def _collect(out, codes: dict[str, list[torch.Tensor]]) -> None:
    for frame in out.frames:
        codes.setdefault(frame.request_id, []).append(frame.codes)


MIXED_PARAMS = (SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_k=0, top_p=0.8),
                SamplingParams(temperature=1.1, top_k=7, top_p=0.9))


@torch.inference_mode()
def sampler_check(model: TTSModel, batch: int, seed: int = 0) -> dict:
    """The frame sampler on its own, padded (and captured on CUDA) vs eager, on the same random inputs."""
    generator = torch.Generator().manual_seed(seed)
    device, vocab = model.device, model.config.talker.vocab_size
    hidden = torch.randn(batch, model.talker.hidden_size, generator=generator).to(device, model.dtype)
    seen = (torch.rand(batch, vocab, generator=generator) < 0.02).to(device)
    frames = torch.randint(0, 100, (batch,), generator=generator)
    talker_params = [MIXED_PARAMS[row % len(MIXED_PARAMS)] for row in range(batch)]
    predictor_params = [MIXED_PARAMS[(row + 1) % len(MIXED_PARAMS)] for row in range(batch)]
    seeds = [7 * row + seed for row in range(batch)]
    talker = RowSampling.build(talker_params, seeds, frames.tolist(), device)
    predictor = RowSampling.build(predictor_params, seeds, frames.tolist(), device, keys=talker.keys)
    penalty = torch.tensor([p.repetition_penalty for p in talker_params], device=device)
    args = (hidden, seen, frames.to(device), penalty, talker, predictor, torch.full((batch,), 2, device=device))
    expected = sample_frames(model, *args).cpu()
    sampler = PaddedFrameSampler(model, max(64, batch), capture=device.type == "cuda")
    first, second = sampler.run(*args).cpu(), sampler.run(*args).cpu()  # capture (or first use), then a replay
    return {"equal": bool(torch.equal(first, expected) and torch.equal(second, expected)),
            "rows_mismatched": int((second != expected).any(dim=1).sum()), "bucket": sampler.bucket(batch)}


def _timing(samples: list[float], batch: int) -> dict:
    median = statistics.median(samples)
    return {"median_ms": median, "min_ms": min(samples), "steps": len(samples), "frames_per_s": 1000 * batch / median}


def compare_batch(model: TTSModel, tokenizer: TextTokenizer, batch: int, steps: int, warmup: int) -> dict:
    """One batch size: the eager engine, then the graphed one (fresh pools), codes compared frame by frame."""
    eager = run_engine(model, tokenizer, batch, steps, warmup, graphs=False)
    gc.collect()
    graphs = run_engine(model, tokenizer, batch, steps, warmup, graphs=True)
    mismatched = sum(int((graphs["codes"][rid] != frames).any(dim=1).sum()) for rid, frames in eager["codes"].items())
    frames = sum(int(frames.shape[0]) for frames in eager["codes"].values())
    timing_eager, timing_graphs = _timing(eager["samples"], batch), _timing(graphs["samples"], batch)
    return {
        "batch": batch, "eager": timing_eager, "graphs": timing_graphs,
        "speedup": timing_eager["median_ms"] / timing_graphs["median_ms"],
        "codes_equal": mismatched == 0, "frames_compared": frames, "frames_mismatched": mismatched,
        "prefill_steps": graphs["prefill_steps"], "talker_buckets": graphs["talker_buckets"],
        "sampler_buckets": graphs["sampler_buckets"], "sampler_equal": sampler_check(model, batch),
        "graph_mode": "CUDA graphs" if model.device.type == "cuda" else "padded eager (no CUDA)",
    }


def table(results: list[dict]) -> list[str]:
    """The markdown table of a report's entries."""
    lines = ["| batch | eager ms/step (min) | graphs ms/step (min) | speedup | frames/s eager / graphs |"
             " codes equal (frames) | sampler alone equal | talker / sampler buckets |",
             "|---|---|---|---|---|---|---|---|"]
    for row in results:
        eager, graphs = row["eager"], row["graphs"]
        lines.append(
            f"| {row['batch']} | {eager['median_ms']:.2f} ({eager['min_ms']:.2f}) | {graphs['median_ms']:.2f} "
            f"({graphs['min_ms']:.2f}) | {row['speedup']:.1f}x | {eager['frames_per_s']:.1f} / "
            f"{graphs['frames_per_s']:.1f} | {row['codes_equal']} ({row['frames_compared']}) | "
            f"{row['sampler_equal']['equal']} | "
            f"{row['talker_buckets']} / {row['sampler_buckets']} |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per engine")
    parser.add_argument("--warmup", type=int, default=3, help="untimed decode steps first (graph captures)")
    parser.add_argument("--commit")
    add_kernel_arguments(parser)
    return settle_model_arguments(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, choices = torch.device(args.device), kernel_choices(args)
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_config_files(Path(scratch) / args.preset, args.preset)
        model = build_model(directory, device, DTYPES[args.dtype], choices=choices)
        tokenizer = build_tokenizer(directory)
    report = Report(args.out, {"benchmark": "gpu_step_graphs (engine decode step, eager vs CUDA graphs)",
                               "preset": args.preset, "dtype": args.dtype, "weights": "random, in memory",
                               "environment": environment(device, args.commit), "steps": args.steps,
                               "warmup": args.warmup, "kernels": kernels_record(choices, model)})
    for batch in args.batch_sizes:
        report.add("results", f"batch {batch}",
                   lambda: compare_batch(model, tokenizer, batch, args.steps, args.warmup))
        print(f"batch {batch} done", flush=True)
    results = report.data.get("results", [])
    report.data["verdict"] = {"codes_equal": bool(results) and all(row["codes_equal"] for row in results),
                              "sampler_equal": bool(results) and all(row["sampler_equal"]["equal"] for row in results)}
    report.save()
    print("\n".join(table(results)))
    return 0 if all(report.data["verdict"].values()) and not report.data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
