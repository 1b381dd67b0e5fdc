"""CPU micro-benchmark of the decode engine's step loop with the tiny model.

For each batch size it fills the engine with that many streaming-text requests, lets their prefills
finish, then times decode steps: steps per second, frames per second, and where a step's time goes.
A request that ends (random weights emit EOS early) is replaced at once, as a serving loop would, so
the batch stays full; `steps_with_prefill` counts the timed steps that carried a newcomer's prefill.
Time is attributed exclusively (nested calls are subtracted from their caller):
- talker_forward: the talker's forward pass over the batch;
- code_predictor_forward: the code predictor's 15 sequential steps, minus the sampling inside them;
- sampling: every `sample` call (codebook 0 and codebooks 1..15);
- other: everything else in `Engine.step` (scheduling, batch building, input rows, logits processing,
  copies, bookkeeping). `outside_forward_share` = (sampling + other) / step time.
On CUDA the split is of host time (launches are asynchronous; the per-step copy of the codes to the
host waits for the device and lands in `other`), while steps and frames per second are exact.

    python -m loadtest.gpu.engine_step_bench --out engine_step_bench.json [--batch-sizes 1 8 32] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from loadtest.gpu.gpu_models import add_kernel_arguments, kernel_choices, kernels_record
from services.engine import model_ops
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_request import EngineRequest
from services.model.kernel_choices import KernelChoices
from services.model.loader import TTSModel, load_model
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams
from services.model.text_tokenizer import TextTokenizer
from services.random_checkpoint.checkpoint_writer import write_checkpoint

TEXT = "The quick brown fox jumps over the lazy dog while the band plays on, loud and clear."


class ExclusiveTimers:
    """Wall time per category, exclusive of nested timed calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []  # per open call: [start, time spent in nested calls]

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, nested = self._stack.pop()
                elapsed = time.perf_counter() - start
                self.seconds[name] += elapsed - nested
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed

    def reset(self) -> None:
        self.seconds.clear()


@contextmanager
def instrumented(model: TTSModel) -> Iterator[ExclusiveTimers]:
    """Time the forward passes and the sampler (instance attributes shadow the methods); undone on exit."""
    timers = ExclusiveTimers()
    sampler = model_ops.sample
    model.talker.forward = timers.wrap("talker_forward", model.talker.forward)
    model.code_predictor.predict = timers.wrap("code_predictor_forward", model.code_predictor.predict)
    model_ops.sample = timers.wrap("sampling", sampler)
    try:
        yield timers
    finally:
        del model.talker.forward, model.code_predictor.predict
        model_ops.sample = sampler


def _requests(tokenizer: TextTokenizer, count: int) -> list[PromptRequest]:
    ids = tuple(tokenizer.encode(assistant_text(TEXT)))
    speakers = ("ryan", "vivian", "eric")
    return [PromptRequest(ids, speaker=speakers[i % 3], language="english", non_streaming=False) for i in range(count)]


def bench_batch(model: TTSModel, tokenizer: TextTokenizer, timers: ExclusiveTimers, batch: int, steps: int,
                warmup: int) -> dict[str, Any]:
    max_frames = warmup + steps + 4
    config = EngineConfig(kv_cache_blocks=batch * (-(-(64 + max_frames) // 16)), block_size=16, max_num_seqs=batch,
                          max_num_batched_tokens=max(2048, batch))
    engine = Engine(model, config)
    requests = _requests(tokenizer, batch)
    started = 0

    def admit(count: int) -> None:
        # Random weights end some requests early (EOS); a newcomer keeps the batch full, as in serving.
        nonlocal started
        for _ in range(count):
            engine.add_request(EngineRequest(
                f"r{started}", requests[started % batch], seed=started, params=SamplingParams(),
                max_new_frames=max_frames))
            started += 1

    admit(batch)
    while any(seq.num_frames == 0 for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(warmup):
        admit(len(engine.step().outcomes))
    timers.reset()
    frames = prefill_steps = 0
    start = time.perf_counter()
    for _ in range(steps):
        out = engine.step()
        frames += len(out.frames)
        prefill_steps += out.num_batched_tokens > len(out.frames)
        admit(len(out.outcomes))
    elapsed = time.perf_counter() - start
    parts = {name: timers.seconds.get(name, 0.0) for name in ("talker_forward", "code_predictor_forward", "sampling")}
    other = elapsed - sum(parts.values())
    per_step_ms = {f"{name}_ms": 1000 * value / steps for name, value in parts.items()}
    return {
        "batch": batch,
        "steps": steps,
        "steps_per_s": steps / elapsed,
        "frames_per_s": frames / elapsed,
        "mean_rows_per_step": frames / steps,
        "steps_with_prefill": prefill_steps,
        "step_ms": 1000 * elapsed / steps,
        **per_step_ms,
        "other_ms": 1000 * other / steps,
        "outside_forward_share": (parts["sampling"] + other) / elapsed,
    }


def _load(checkpoint: Path | None, device: torch.device, choices: KernelChoices) -> tuple[TTSModel, TextTokenizer]:
    if checkpoint is not None:
        return load_model(checkpoint, device=device, choices=choices), TextTokenizer.from_dir(checkpoint)
    with tempfile.TemporaryDirectory() as scratch:
        written = write_checkpoint(Path(scratch) / "tiny", "tiny", seed=0, with_codec=False)
        return load_model(written, device=device, choices=choices), TextTokenizer.from_dir(written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("engine_step_bench.json"), help="JSON results file")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=50, help="timed decode steps per batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed decode steps before timing")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--checkpoint", type=Path, help="a tiny checkpoint directory (default: write one)")
    parser.add_argument("--device", default="cpu", help="torch device of the model and the KV pool")
    add_kernel_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    choices = kernel_choices(args)
    model, tokenizer = _load(args.checkpoint, torch.device(args.device), choices)
    with instrumented(model) as timers:
        results = [bench_batch(model, tokenizer, timers, b, args.steps, args.warmup) for b in args.batch_sizes]
    report = {
        "benchmark": "engine_step_bench",
        "model": str(args.checkpoint) if args.checkpoint else "tiny preset, seed 0 (random weights)",
        "device": args.device,
        "kernels": kernels_record(choices, model),
        "torch": torch.__version__,
        "threads": args.threads,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in results:
        print(f"batch {row['batch']:3d}: {row['steps_per_s']:7.1f} steps/s, {row['frames_per_s']:8.1f} frames/s, "
              f"outside forward {100 * row['outside_forward_share']:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
