"""The talker decode step three ways, at several batch sizes: reference eager, fast path eager, fast path graphed.

- reference: `Talker.forward` with the reference kernel forced (what every step ran before the fast path:
  host syncs, so no graph);
- fast: `Talker.forward` as the engine calls it now (a decode-only batch selects the sync-free kernel);
- graph: the engine's own `PaddedTalkerStep` (services/engine/talker_graphs.py) with the engine's default
  limits (max_num_seqs 64, max_model_len 4096: one 256-column table), so a call
  includes staging the metadata, its one host-to-device copy, the input-row copy and the replay; on a
  device without CUDA it runs the same padded step eagerly.
Checks before timing, recorded per batch: the decode kernel equals the reference in float32 on the device
(NaN-poisoned free blocks, scattered tables), the fast and graphed talker outputs equal the reference's in
the model dtype, and on CUDA the fast step and the graph step run under `torch.cuda.set_sync_debug_mode
("error")` (the reference is probed too: it must fail, which shows the probe works).

    python -m experiments.gpu_decode_path --out decode_path.json [--device cuda] [--batch-sizes 1 8 32 64]
    python -m experiments.gpu_decode_path --out /tmp/x.json --device cpu --tiny    (the CPU smoke run)
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from loadtest.gpu.gpu_common import bench_entry, measure_ceilings, tensor_bytes
from loadtest.gpu.gpu_micro import DTYPES, Report, add_model_arguments, environment, settle_model_arguments
from loadtest.gpu.gpu_models import build_model, write_config_files
from loadtest.gpu.gpu_talker_bench import BLOCK_SIZE, decode_batch, kv_bytes_read
from services.engine.config import EngineConfig
from services.engine.talker_graphs import PaddedTalkerStep, TalkerGraphSpec
from services.model.loader import TTSModel
from services.model.paged_attention import DECODE, FUSED_DECODE, REFERENCE, PagedAttention, select_kernel

KERNEL_TOLERANCE = 1e-5
"""Largest absolute difference allowed between the decode and the reference kernel in float32."""
STEP_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
"""Largest relative error (norm) allowed between whole talker steps in the model dtype."""
ENGINE_DEFAULTS = EngineConfig(kv_cache_blocks=1)


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.float(), expected.float()
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))


def _poison_free_blocks(pool: torch.Tensor, tables: torch.Tensor) -> None:
    """NaN into every block no row owns (as a pool that served other requests may hold)."""
    free = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    free[tables.flatten()] = False
    pool[free] = float("nan")


def kernel_check(model: TTSModel, batch, num_blocks: int, seed: int) -> dict:
    """The decode kernel against the reference kernel, float32 on the model's device, every layer's shape."""
    d = model.config.talker.decoder
    generator = torch.Generator(device=model.device).manual_seed(seed)
    shape = model.talker.kv_pool_shape(num_blocks, BLOCK_SIZE)
    pool = torch.randn(shape, device=model.device, generator=generator)
    _poison_free_blocks(pool, batch.block_tables)
    rows = batch.num_seqs
    q = torch.randn(rows, d.num_heads, d.head_dim, device=model.device, generator=generator)
    k, v = (torch.randn(rows, d.num_kv_heads, d.head_dim, device=model.device, generator=generator) for _ in range(2))
    scale = d.head_dim**-0.5
    fast = PagedAttention(pool.clone(), batch, scale, DECODE)(0, q, k, v)
    reference = PagedAttention(pool.clone(), batch, scale, REFERENCE)(0, q, k, v)
    difference = float((fast - reference).abs().max())
    return {"max_abs_diff": difference, "finite": bool(torch.isfinite(fast).all()),
            "equal": difference <= KERNEL_TOLERANCE and bool(torch.isfinite(fast).all())}


NOT_PROBED = "not probed: torch.cuda.set_sync_debug_mode needs CUDA"


def sync_probe(fn, device: torch.device) -> str | None:
    """None if `fn` ran with no host synchronisation (CUDA sync debug mode 'error'), else the error."""
    if device.type != "cuda":
        return NOT_PROBED
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


def decode_step(model: TTSModel, batch_size: int, context: int, opts: dict) -> dict:
    """One batch size: checks, then timings and launch counts of the three variants."""
    device, talker = model.device, model.talker
    num_blocks = batch_size * -(-(context + 1) // BLOCK_SIZE) + 8
    host_batch = replace(decode_batch(batch_size, context, num_blocks, torch.device("cpu"), seed=batch_size),
                         max_seq_len=context + 1)
    batch = replace(decode_batch(batch_size, context, num_blocks, device, seed=batch_size), max_seq_len=context + 1)
    if select_kernel(batch) not in (DECODE, FUSED_DECODE):
        raise RuntimeError("a decode batch did not select the decode kernel")
    # One block past the batch's: the padded step's scratch block (as the engine reserves it).
    pool = torch.randn(talker.kv_pool_shape(num_blocks + 1, BLOCK_SIZE), device=device, dtype=model.dtype)
    _poison_free_blocks(pool[:num_blocks], batch.block_tables)
    embeds = torch.randn(batch_size, talker.hidden_size, device=device, dtype=model.dtype)
    spec = TalkerGraphSpec(max_num_seqs=max(batch_size, ENGINE_DEFAULTS.max_num_seqs),
                           max_blocks_per_seq=-(-ENGINE_DEFAULTS.max_model_len // BLOCK_SIZE),
                           max_num_tokens=max(batch_size, ENGINE_DEFAULTS.max_num_seqs), capture=device.type == "cuda")
    padded = PaddedTalkerStep(talker, pool, scratch_block=num_blocks, spec=spec)

    def reference() -> torch.Tensor:
        return talker(embeds, batch, pool, kernel=REFERENCE)

    def fast() -> torch.Tensor:
        return talker(embeds, batch, pool)

    def graph() -> torch.Tensor:
        return padded.run(embeds, host_batch)

    expected = reference().clone()
    errors = {"fast": _relative_error(fast(), expected), "graph": _relative_error(graph(), expected)}
    tolerance = STEP_TOLERANCE[str(model.dtype).removeprefix("torch.")]
    weight_bytes = tensor_bytes(talker.model)
    bytes_read = weight_bytes + kv_bytes_read(model, batch_size, context, pool.element_size())
    return {
        "batch": batch_size, "context_tokens": context, "bytes_read": bytes_read,
        "floor_ms": 1000 * bytes_read / opts["copy_bandwidth"],
        "kernel_check_float32": kernel_check(model, batch, num_blocks, seed=batch_size),
        "step_rel_error": errors, "step_tolerance": tolerance,
        "steps_equal": all(error <= tolerance for error in errors.values()),
        "graph_mode": "cuda_graph" if spec.capture else "padded eager (no CUDA)",
        "graph_bucket": {"tokens": padded.bucket(host_batch)},
        "sync_free": {"fast": sync_probe(fast, device), "graph": sync_probe(graph, device),
                      "reference (must fail on CUDA)": sync_probe(reference, device)},
        "reference": bench_entry(reference, device, opts["warmup"], opts["reps"], graph=False),
        "fast": bench_entry(fast, device, opts["warmup"], opts["reps"], graph=False),
        "graph": bench_entry(graph, device, opts["warmup"], opts["reps"], graph=False),
    }


def _verdict(probe: str | None) -> str:
    if probe is None:
        return "yes"
    return "n/a" if probe == NOT_PROBED else "NO"


def table(results: list[dict]) -> list[str]:
    """The markdown table of a report's entries."""
    lines = ["| batch | reference eager ms | kernels | fast eager ms | kernels | fast graph ms | kernels | floor ms |"
             " graph/floor | kernel diff (f32) | step rel err fast / graph | sync-free fast / graph |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results:
        cells = [str(row["batch"])]
        for name in ("reference", "fast", "graph"):
            cells += [f"{row[name]['eager']['median_ms']:.2f}", str(row[name]["launches"]["cuda_kernels"])]
        graph_ms = row["graph"]["eager"]["median_ms"]
        sync = row["sync_free"]
        cells += [f"{row['floor_ms']:.3f}", f"{graph_ms / row['floor_ms']:.0f}x",
                  f"{row['kernel_check_float32']['max_abs_diff']:.1e}",
                  f"{row['step_rel_error']['fast']:.1e} / {row['step_rel_error']['graph']:.1e}",
                  f"{_verdict(sync['fast'])} / {_verdict(sync['graph'])}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report")
    add_model_arguments(parser)
    parser.add_argument("--context", type=int, default=256, help="cached tokens per sequence")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--copy-mib", type=int, default=2048, help="bytes copied to measure bandwidth, MiB")
    parser.add_argument("--commit", help="the commit measured (recorded in the report)")
    return settle_model_arguments(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    bandwidth = measure_ceilings(device, args.copy_mib * 2**20, gemm_size=16)["copy_bandwidth_bytes_per_s"]
    with tempfile.TemporaryDirectory() as scratch:
        model = build_model(write_config_files(Path(scratch) / args.preset, args.preset), device, DTYPES[args.dtype])
    report = Report(args.out, {"benchmark": "gpu_decode_path", "preset": args.preset, "dtype": args.dtype,
                               "weights": "random, in memory", "copy_bandwidth_bytes_per_s": bandwidth,
                               "environment": environment(device, args.commit)})
    opts = {"warmup": args.warmup, "reps": args.reps, "copy_bandwidth": bandwidth}
    with torch.inference_mode():
        for size in args.batch_sizes:
            report.add("decode_step", f"batch {size}", lambda: decode_step(model, size, args.context, opts))
            print(f"decode step batch {size} done", flush=True)
    results = report.data.get("decode_step", [])
    print("\n".join(table(results)))
    checks_pass = all(row["kernel_check_float32"]["equal"] and row["steps_equal"] for row in results)
    syncs_pass = device.type != "cuda" or all(
        row["sync_free"]["fast"] is None and row["sync_free"]["graph"] is None for row in results)
    report.data["verdict"] = {"checks_pass": checks_pass, "sync_free": syncs_pass}
    report.save()
    return 0 if checks_pass and syncs_pass and not report.data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
