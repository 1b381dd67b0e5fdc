"""What the host spends queueing one engine step, decode-only against mixed (a new request's prefill among 63
decoding rows), alone and beside a thread that keeps the interpreter busy as decode's event loop does.

In the mesh at 64 streams (H200, 2026-12-03) a mixed step took 8 ms on the host to launch (p50) against ~5 for all
steps, longer than its device work, so the card waited for the host in nearly half the steps. This probe says whether
that is the mixed step's own work (more torch calls) or the interpreter lock it must win back after each torch call
while another thread runs Python. It builds a preset's engine with CUDA graphs, seats 63 fixed-length requests, then
alternates a decode-only step with a mixed one (the oldest request aborted and a new one added before it), timing
`ModelRunner.launch` and its parts with the host clock; each step is synchronised so no launch waits on the device.

    python3 -m experiments.launch_split --out F [--preset 0.6b] [--steps 40]
    python3 -m experiments.launch_split --out F --preset tiny --dtype float32 --device cpu --steps 4   # rehearsal
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

from loadtest.gpu.engine_step_bench import TEXT
from loadtest.gpu.gpu_common import dispatched_ops
from loadtest.gpu.gpu_micro import DTYPES, environment
from loadtest.gpu.gpu_models import build_in_memory
from services.engine import runner as runner_module
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_request import EngineRequest
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams

SEATED = 63
"""Requests decoding in every step; a mixed step adds one prefill."""

PARTS = ("build_attention_batch", "slots_of", "hold", "_input_rows", "_talker", "_sample", "InFlightStep.start")
"""The parts of `ModelRunner.launch` timed apart."""


class PartClock:
    """Host seconds spent in each wrapped callable during the current step, nested calls included (`launch` holds
    its parts; `engine_step_bench.ExclusiveTimers` would subtract them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return timed


CLOCK = PartClock()


@contextlib.contextmanager
def _module_parts_timed():
    """The module-level parts wrapped for every engine the probe builds, and put back after (the probe may run
    inside another program, a test)."""
    build, start = runner_module.build_attention_batch, runner_module.InFlightStep.__dict__["start"]
    runner_module.build_attention_batch = CLOCK.wrap("build_attention_batch", build)
    # Bound to the class here, so the wrapper stays a plain call.
    runner_module.InFlightStep.start = CLOCK.wrap("InFlightStep.start", runner_module.InFlightStep.start)
    try:
        yield
    finally:
        runner_module.build_attention_batch = build
        runner_module.InFlightStep.start = start


def _instrument(engine: Engine) -> None:
    runner = engine.runner
    runner.seen.slots_of = CLOCK.wrap("slots_of", runner.seen.slots_of)
    runner.slot_params.hold = CLOCK.wrap("hold", runner.slot_params.hold)
    for name in ("_input_rows", "_talker", "_sample"):
        setattr(runner, name, CLOCK.wrap(name, getattr(runner, name)))
    runner.launch = CLOCK.wrap("launch", runner.launch)


class BusyInterpreter:
    """A thread that runs pure Python while it is on (an event loop publishing chunks holds the lock like this)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        total = 0
        while not self._stop.is_set():
            for value in range(2000):
                total += value * value

    def __enter__(self) -> BusyInterpreter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(model, tokenizer, steps: int, busy: bool, counter: list[int]) -> dict:
    engine = Engine(model, EngineConfig(kv_cache_blocks=4096, max_num_seqs=64))
    ids = tuple(tokenizer.encode(assistant_text(TEXT)))
    device = model.device

    def add() -> str:
        request_id = f"r{counter[0]}"
        counter[0] += 1
        engine.add_request(EngineRequest(
            request_id, PromptRequest(ids, speaker="ryan", language="english", non_streaming=False), seed=counter[0],
            params=SamplingParams(), max_new_frames=1000, ignore_eos=True))
        return request_id

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seated = [add() for _ in range(SEATED)]
    for _ in range(6):
        engine.step()  # every request past its prefill
    synchronize()
    clock = CLOCK
    _instrument(engine)
    samples: dict[str, list[dict[str, float]]] = {"decode": [], "mixed": []}
    ops: dict[str, dict[str, int]] = {}
    with BusyInterpreter() if busy else contextlib.nullcontext():
        for index in range(2 * steps):
            kind = "mixed" if index % 2 else "decode"
            if kind == "mixed":
                engine.abort_request(seated.pop(0))
                seated.append(add())
            clock.seconds.clear()
            if index >= 2 * steps - 2 and not busy:
                ops[kind] = dispatched_ops(engine.step)
            else:
                engine.step()
            synchronize()
            samples[kind].append(dict(clock.seconds))
    for request_id in seated:
        engine.abort_request(request_id)
    result = {"busy_thread": busy}
    for kind, rows in samples.items():
        rows = rows[2:]  # the first of each kind pays one-time work (a bucket's first use)
        result[kind] = {part: round(1000 * statistics.median(row.get(part, 0.0) for row in rows), 3)
                        for part in ("launch", *PARTS)}
        if kind in ops:
            result[kind]["aten_ops"] = sum(ops[kind].values())
            result[kind]["aten_ops_by_name"] = dict(sorted(ops[kind].items(), key=lambda item: -item[1]))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--steps", type=int, default=40, help="steps of each kind, per run")
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a rehearsal, eager steps)")
    parser.add_argument("--switch-interval-ms", type=float, default=5.0,
                        help="the interpreter's switch interval (decode's default: 5, Python's)")
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model, tokenizer = build_in_memory(args.preset, device, DTYPES[args.dtype])
    counter, interval = [0], sys.getswitchinterval()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    try:
        with _module_parts_timed():
            runs = [run(model, tokenizer, args.steps, busy, counter) for busy in (False, True)]
    finally:
        sys.setswitchinterval(interval)
    args.out.write_text(json.dumps({"benchmark": "launch_split", "preset": args.preset, "dtype": args.dtype,
                                    "switch_interval_ms": args.switch_interval_ms,
                                    "environment": environment(device, args.commit), "results": runs}, indent=2))
    print("| busy thread | step | launch ms | " + " | ".join(PARTS) + " | aten ops |")
    print("|---|---|---|" + "---|" * len(PARTS) + "---|")
    for entry in runs:
        for kind in ("decode", "mixed"):
            row = entry[kind]
            print(f"| {entry['busy_thread']} | {kind} | {row['launch']:.2f} | "
                  + " | ".join(f"{row[part]:.2f}" for part in PARTS) + f" | {row.get('aten_ops', '')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
