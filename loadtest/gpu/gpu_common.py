"""Measuring tools shared by the GPU micro-benchmarks: timing, kernel counts, CUDA graph capture, ceilings, floors.

Everything here also runs on the CPU (for the CPU test that keeps the scripts from rotting): timing falls back to
the host clock, kernel counts and graph capture report None with the reason, and the ceilings are measured with
whatever sizes the caller gives.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

Call = Callable[[], object]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Call, device: torch.device, warmup: int, reps: int) -> dict[str, float]:
    """Median and best wall time of `fn` in ms, device work included (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            samples.append(1000 * (time.perf_counter() - begin))
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "reps": reps}


def count_launches(fn: Call, device: torch.device) -> dict[str, int | None]:
    """One call of `fn` under torch.profiler: CUDA kernels and memcpy/memset (None off CUDA), and aten ops on the host."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    events = prof.events()
    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    copies = sum(1 for e in device_events if e.name.startswith(("Memcpy", "Memset")))
    aten = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::"))
    on_cuda = device.type == "cuda"
    return {
        "cuda_kernels": len(device_events) - copies if on_cuda else None,
        "cuda_copies": copies if on_cuda else None,
        "aten_ops": aten,
    }


def graphed_us_per_call(fn: Call, device: torch.device, calls: int, reps: int = 15) -> float:
    """Device microseconds of one call of `fn` as a serving graph sees it: `calls` calls captured in one CUDA graph
    (warmed up on a side stream first), the replay timed (median of `reps`) and divided by `calls`, so no launch
    latency of the host is in it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return time_call(graph.replay, device, warmup=3, reps=reps)["median_ms"] * 1000 / calls


def top_kernels(fn: Call, device: torch.device, limit: int = 20) -> list[dict[str, object]]:
    """The kernels of one call of `fn` on CUDA grouped by name, most device time first: which launches a graph
    spends its time on (name cut to 90 characters, count, total microseconds)."""
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            entry = totals.setdefault(event.name[:90], [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:limit]
    return [{"kernel": name, "count": int(count), "total_us": round(us, 1)} for name, (count, us) in ranked]


def dispatched_ops(fn: Call) -> dict[str, int]:
    """How many times each aten op is dispatched at the top level (not inside another aten op) during one call of
    `fn`: each costs the host its dispatch, and on a GPU is a launch or more, whatever the device it runs on."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    calls: dict[str, int] = {}
    for event in prof.events():
        parent = event.cpu_parent
        if event.name.startswith("aten::") and not (parent is not None and parent.name.startswith("aten::")):
            calls[event.name] = calls.get(event.name, 0) + 1
    return calls


def count_flops(fn: Call, estimate: int) -> dict[str, object]:
    """Matrix and convolution FLOPs of one call by torch's flop counter (elementwise work is not counted).

    Some torch versions' counter refuses grouped-query SDPA (torch 2.11: "query/key/value shapes are
    incompatible"); then the caller's `estimate` stands in, and the report says so.
    """
    try:
        with FlopCounterMode(display=False) as counter:
            fn()
    except Exception as exc:  # the counter's own assertion; the estimate is the documented fallback
        return {"flops": estimate, "flops_source": f"estimate (flop counter failed: {type(exc).__name__}: {exc})"}
    return {"flops": int(counter.get_total_flops()), "flops_source": "torch.utils.flop_counter"}


@dataclass(frozen=True, slots=True)
class Captured:
    """A CUDA graph of a call, or the reason there is none."""

    replay: Call | None
    error: str | None


def capture_graph(fn: Call, device: torch.device) -> Captured:
    """Capture `fn` into a CUDA graph after a warm-up on a side stream; a failure is reported, not raised.

    A failed capture can leave the CUDA context unusable, so callers probe code that may not capture last.
    """
    if device.type != "cuda":
        return Captured(None, "CUDA graphs need a CUDA device")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # any failure to capture is a finding to report
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Captured(None, f"{type(exc).__name__}: {first_line[:300]}")
    return Captured(graph.replay, None)


def measure_ceilings(device: torch.device, copy_bytes: int, gemm_size: int) -> dict[str, float]:
    """Device copy bandwidth (bytes read + written per second) and bf16 GEMM rate on random data."""
    source = torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = time_call(lambda: target.copy_(source), device, warmup=3, reps=10)
    del source, target
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(gemm_size, gemm_size, device=device, dtype=dtype)
    b = torch.randn(gemm_size, gemm_size, device=device, dtype=dtype)
    gemm = time_call(lambda: a @ b, device, warmup=3, reps=10)
    return {
        "copy_bytes": copy_bytes,
        "copy_bandwidth_bytes_per_s": 2 * copy_bytes / (copy["median_ms"] / 1000),
        "gemm_size": gemm_size,
        "gemm_dtype": str(dtype).removeprefix("torch."),
        "gemm_flops_per_s": 2 * gemm_size**3 / (gemm["median_ms"] / 1000),
    }


def floor_ms(bytes_read: int, flops: dict[str, object], ceilings: dict[str, float]) -> dict[str, object]:
    """The DESIGN.md floor (bytes read / copy bandwidth) and the arithmetic floor (FLOPs / GEMM rate), in ms.

    `flops` is `count_flops`'s answer (kept in the result with its source)."""
    memory = 1000 * bytes_read / ceilings["copy_bandwidth_bytes_per_s"]
    compute = 1000 * int(flops["flops"]) / ceilings["gemm_flops_per_s"]
    return {**flops, "memory_floor_ms": memory, "compute_floor_ms": compute, "floor_ms": max(memory, compute)}


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's distinct parameters (shared tensors counted once)."""
    seen: dict[int, int] = {}
    for parameter in module.parameters():
        seen[parameter.data_ptr()] = parameter.numel() * parameter.element_size()
    return sum(seen.values())


def bench_entry(fn: Call, device: torch.device, warmup: int, reps: int, graph: bool) -> dict[str, object]:
    """Eager timing and launch counts of `fn`, plus graph-replay timing when `graph` and the capture succeeds."""
    entry: dict[str, object] = {"eager": time_call(fn, device, warmup, reps), "launches": count_launches(fn, device)}
    if graph:
        captured = capture_graph(fn, device)
        entry["graph_error"] = captured.error
        if captured.replay is not None:
            entry["graph"] = time_call(captured.replay, device, warmup, reps)
            entry["graph_launches"] = count_launches(captured.replay, device)
    return entry


def checked_launch_us(call: Call, want: torch.Tensor, device: torch.device, launches: int = 100) -> tuple[float, float]:
    """A launch choice measured: the largest difference of `call()` from `want`, and its device microseconds as a
    serving graph sees it (`graphed_us_per_call` over `launches` launches, median of 20 replays)."""
    error = float((call().float() - want.float()).abs().max())
    return error, graphed_us_per_call(call, device, launches, reps=20)


def keep(results: list[dict], entry: dict, line: str) -> None:
    """One measured launch choice: added to a sweep's results and printed as it comes (a long sweep shows progress)."""
    results.append(entry)
    print(line, flush=True)


def write_sweep(path: Path | None, benchmark: str, results: list[dict]) -> None:
    """A launch-choice sweep's entries as JSON at `path` (nothing without one): {"benchmark", "results"}."""
    if path is not None:
        path.write_text(json.dumps({"benchmark": benchmark, "results": results}, indent=2))
