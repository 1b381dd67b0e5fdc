"""Where a cloned voice's reference-audio work goes: one `VoiceCloner.make_prompt` call, timed and broken down.

    python -m experiments.voice_prompt_probe --out voice_prompt.json [--preset 0.6b] [--seconds 6] [--device cuda]

Writes a random base checkpoint, loads it as decode does, and times `make_prompt` on synthetic reference audio of
`--seconds` at 24 kHz, in-context (speaker encoder + codec encoder) and x-vector only (speaker encoder alone): the
median wall time of a call, the aten ops it dispatches (the host's share, on any device), and on CUDA the device
time of its kernels (how busy it keeps the card), their count, and the kernels by device time. A call whose wall
time is far above its device time is bound by the host's launches (the interpreter lock it shares with the step
loop); one near it, by the device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from loadtest.gpu.gpu_common import dispatched_ops, top_kernels
from services.model.loader import load_model
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from services.random_checkpoint.checkpoint_writer import write_checkpoint

SAMPLE_RATE = 24000


def reference(seconds: float) -> np.ndarray:
    """A voiced-looking test signal (a wavering tone with an envelope and a little noise)."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    tone = np.sin(2 * np.pi * (140 + 40 * np.sin(2 * np.pi * 3 * t)) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return (0.3 * tone + 0.02 * np.random.default_rng(7).standard_normal(t.size)).astype(np.float32)


def measure(cloner: VoiceCloner, samples: np.ndarray, x_vector_only: bool, reps: int) -> dict:
    def call():
        return cloner.make_prompt(samples, SAMPLE_RATE, None if x_vector_only else "A short reference sentence.",
                                  x_vector_only)

    for _ in range(2):
        call()
    walls = []
    for _ in range(reps):
        started = time.perf_counter()
        call()  # returns after its stream is synchronised: the wall time is the caller's wait
        walls.append(1000 * (time.perf_counter() - started))
    ops = dispatched_ops(call)
    result = {"mode": "x_vector_only" if x_vector_only else "in_context", "wall_ms_median": statistics.median(walls),
              "wall_ms_min": min(walls), "host_ops": sum(ops.values()),
              "top_host_ops": dict(sorted(ops.items(), key=lambda item: -item[1])[:15])}
    if cloner.device.type != "cuda":
        return result
    kernels = top_kernels(call, cloner.device, limit=10_000)  # every kernel, most device time first
    return result | {"device_ms": sum(k["total_us"] for k in kernels) / 1000,
                     "launches": sum(k["count"] for k in kernels), "top_kernels": kernels[:15]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as folder:
        directory = write_checkpoint(Path(folder) / "model", args.preset, seed=0, dtype=args.dtype,
                                     tts_model_type="base", show_progress=False)
        model = load_model(directory, dtype=dtype, device=args.device)
        with torch.inference_mode():
            cloner = VoiceCloner.load(model, TextTokenizer.from_dir(directory))
    samples = reference(args.seconds)
    results = [measure(cloner, samples, mode, args.reps) for mode in (False, True)]
    for result in results:
        print(f"{result['mode']}: wall {result['wall_ms_median']:.1f} ms (min {result['wall_ms_min']:.1f}), "
              f"{result['host_ops']} ops dispatched", end="")
        if "launches" not in result:
            print(" (not on CUDA: no kernels)")
            continue
        print(f", device {result['device_ms']:.1f} ms in {result['launches']} launches")
        for kernel in result["top_kernels"][:8]:
            print(f"  {kernel['total_us']:9.1f} us {kernel['count']:5d}x {kernel['kernel']}")
    args.out.write_text(json.dumps({"probe": "voice_prompt", "preset": args.preset, "device": args.device,
                                    "dtype": args.dtype, "reference_s": args.seconds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
