"""How much the codec slows the engine on one GPU: in another process (two CUDA contexts, time-sliced) against in the
same process on its own CUDA stream (kernels of both may run at once).

The mesh's steady state at 64 streams, without the bus: a graphed engine (0.6B preset, random weights) decodes 64
fixed-length requests, and the codec (graphed slot decoder, 64 streams) decodes one 8-frame chunk of every stream each
time the engine has made 8 more frames, as the vocoder does. The engine runs on a stream of the highest priority.
Five timings:

- engine alone: ms per `Engine.step()` over `--steps` steps (the overlapped loop: the host prepares step N+1 while
  the device runs step N);
- codec alone: ms per 64 x 8 call, audio brought to the host;
- codec in another process: the engine's ms per step while a second process keeps up with it (a shared counter of
  the engine's steps paces it);
- codec on another stream: the same with the codec on a thread of this process, on its own CUDA stream of the
  engine's priority;
- codec on a low-priority stream: the same at the lowest priority, so that the block scheduler hands the engine's
  kernels the SMs first.

Run it under an MPS control daemon (`nvidia-cuda-mps-control -d`) and the two processes share the card at once.

    python3 -m loadtest.gpu.overlap_probe --out overlap.json [--steps 160] [--commit C] [--triton-conv false]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from loadtest.gpu.gpu_models import add_kernel_arguments, kernel_choices, kernels_record
from services.model.kernel_choices import KernelChoices

CHUNK_FRAMES, STREAMS = 8, 64
HIGHEST, LOWEST = -100, 0
"""Stream priorities; torch maps a value outside the device's range to its nearest end (CUDA's lowest is 0)."""
_TEXT = "The probe keeps sixty four streams speaking while the codec turns their codes into audio."


class Pacer:
    """The engine's step count, shared with the codec side; the codec waits for 8 more steps a call."""

    def __init__(self, context) -> None:
        self.steps = context.Value("l", 0, lock=False)
        self.stop = context.Event()

    def wait_for(self, steps: int) -> bool:
        """Spin (with short sleeps) until the engine has made `steps` steps; False once stopped."""
        while self.steps.value < steps:
            if self.stop.is_set():
                return False
            time.sleep(0.0002)
        return True


def _codec(device: torch.device, choices: KernelChoices):
    from loadtest.gpu.gpu_models import build_codec
    from services.model.codec.slot_decoder import SlotDecoder

    decoder = build_codec("0.6b", device, torch.bfloat16, choices=choices)
    slots = SlotDecoder(decoder, max_streams=STREAMS, max_rows=STREAMS, max_chunk_frames=CHUNK_FRAMES)
    ids = [slots.acquire() for _ in range(STREAMS)]
    generator = torch.Generator().manual_seed(5)
    chunk = [torch.randint(0, decoder.config.codebook_size, (CHUNK_FRAMES, decoder.config.num_quantizers),
                           generator=generator) for _ in range(STREAMS)]

    def call() -> float:
        begin = time.perf_counter()
        slots.decode_chunks(ids, chunk, to_host=True)
        return (time.perf_counter() - begin) * 1000

    call()  # builds and captures the 64 x 8 step
    return call


def _paced_calls(call, pacer: Pacer, calls_ms: list[float]) -> None:
    made = 0
    while pacer.wait_for((made + 1) * CHUNK_FRAMES):
        calls_ms.append(call())
        made += 1


def _codec_process(pacer: Pacer, ready, results, choices: KernelChoices) -> None:
    device = torch.device("cuda")
    call = _codec(device, choices)
    calls_ms: list[float] = []
    ready.set()
    _paced_calls(call, pacer, calls_ms)
    results.put(calls_ms)


def _engine(device: torch.device, steps: int, choices: KernelChoices):
    from loadtest.gpu.gpu_micro import DTYPES
    from loadtest.gpu.gpu_models import build_model, build_tokenizer, write_config_files
    from services.engine.config import EngineConfig
    from services.engine.engine import Engine
    from services.engine.engine_request import EngineRequest
    from services.model.prompt import PromptRequest, assistant_text
    from services.model.sampling import SamplingParams

    with tempfile.TemporaryDirectory() as scratch:
        directory = write_config_files(Path(scratch) / "0.6b", "0.6b")
        model = build_model(directory, device, DTYPES["bfloat16"], choices=choices)
        tokenizer = build_tokenizer(directory)
    frames = 8 * steps + 64
    engine = Engine(model, EngineConfig(kv_cache_blocks=STREAMS * (frames // 16 + 8) + 64, max_num_seqs=STREAMS))
    ids = tuple(tokenizer.encode(assistant_text(_TEXT)))
    for index in range(STREAMS):
        request = PromptRequest(ids, speaker="ryan", language="english", non_streaming=False)
        engine.add_request(EngineRequest(
            f"r{index}", request, seed=index, params=SamplingParams(), max_new_frames=frames, ignore_eos=True))
    for _ in range(6):
        engine.step()
    return engine


def _timed_steps(engine, steps: int, pacer: Pacer | None) -> float:
    """ms per step over `steps` steps (the device drained before and after)."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(steps):
        engine.step()
        if pacer is not None:
            pacer.steps.value += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - begin) * 1000 / steps


def _summary(calls_ms: list[float]) -> dict:
    return {"calls": len(calls_ms), "median_ms": statistics.median(calls_ms) if calls_ms else None}


def _stream_scenario(engine, call, steps: int, codec_stream: torch.cuda.Stream, context) -> dict:
    pacer, calls_ms = Pacer(context), []

    def on_stream() -> None:
        with torch.cuda.stream(codec_stream):
            _paced_calls(call, pacer, calls_ms)

    thread = threading.Thread(target=on_stream, name="codec")
    thread.start()
    scenario = {"engine_ms_per_step": _timed_steps(engine, steps, pacer)}
    pacer.stop.set()
    thread.join(60)
    return scenario | {"codec": _summary(calls_ms)}


def probe(steps: int, choices: KernelChoices) -> dict:
    device = torch.device("cuda")
    engine_stream = torch.cuda.Stream(device, priority=HIGHEST)
    with torch.cuda.stream(engine_stream):
        return _probe(device, steps, choices) | {"engine_stream_priority": engine_stream.priority}


def _probe(device: torch.device, steps: int, choices: KernelChoices) -> dict:
    engine = _engine(device, steps, choices)
    result = {"steps": steps, "engine_alone_ms_per_step": _timed_steps(engine, steps, None)}

    context = mp.get_context("spawn")
    pacer, ready, results = Pacer(context), context.Event(), context.Queue()
    child = context.Process(target=_codec_process, args=(pacer, ready, results, choices), daemon=True)
    child.start()
    if not ready.wait(300):
        raise RuntimeError("the codec process did not get ready in 300 s")
    result["codec_process"] = {"engine_ms_per_step": _timed_steps(engine, steps, pacer)}
    pacer.stop.set()
    result["codec_process"]["codec"] = _summary(results.get(timeout=60))
    child.join(60)

    call = _codec(device, choices)
    result["codec_alone"] = _summary([call() for _ in range(10)])
    result["codec_stream"] = _stream_scenario(engine, call, steps, torch.cuda.Stream(device, priority=HIGHEST),
                                              context)
    result["codec_low_priority_stream"] = _stream_scenario(engine, call, steps,
                                                           torch.cuda.Stream(device, priority=LOWEST), context)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--commit")
    add_kernel_arguments(parser)
    args = parser.parse_args(argv)
    from loadtest.gpu.gpu_micro import environment

    choices = kernel_choices(args)
    report = {"benchmark": "overlap_probe", "preset": "0.6b", "dtype": "bfloat16", "streams": STREAMS,
              "chunk_frames": CHUNK_FRAMES, "environment": environment(torch.device("cuda"), args.commit),
              "kernels": kernels_record(choices), "results": probe(args.steps, choices)}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["results"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
