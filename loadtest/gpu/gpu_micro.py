"""GPU micro-benchmarks of the model parts at several batch sizes, each against its floor (one JSON report).

Parts (`--parts`): `model` (a talker decode step over the paged pool and a code-predictor frame) and `codec`
(per-frame decoding, streaming chunk and full). Every entry holds eager and, where the code captures, CUDA-graph
medians, the CUDA kernels and copies of one call (torch.profiler), and the floors: bytes read / measured copy
bandwidth (DESIGN.md) and FLOPs / measured GEMM rate. The report is rewritten after every entry, so a crash keeps
what was measured; an entry that fails records its error and the run goes on.

    python -m loadtest.gpu.gpu_micro --out micro.json --device cuda [--parts model codec] [--preset 0.6b]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from loadtest.gpu.gpu_codec_bench import codec_batch, codec_graph_probe
from loadtest.gpu.gpu_common import measure_ceilings
from loadtest.gpu.gpu_models import (KERNEL_SETTINGS, add_kernel_arguments, build_codec, build_model, kernel_choices,
                                     kernels_record, write_config_files)
from loadtest.gpu.gpu_talker_bench import predictor_frame, talker_step

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--device/--tiny/--preset/--dtype/--batch-sizes, shared by the single-model GPU scripts."""
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny preset in float32 (CPU smoke run)")
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: bfloat16, float32 with --tiny")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])


def settle_model_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """--tiny means the tiny preset in float32; otherwise bfloat16 unless --dtype says."""
    if args.tiny:
        args.preset, args.dtype = "tiny", args.dtype or "float32"
    args.dtype = args.dtype or "bfloat16"
    return args


def environment(device: torch.device, commit: str | None) -> dict:
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sms=props.multi_processor_count, gpu_memory_gib=props.total_memory / 2**30,
                    cuda=torch.version.cuda)
    return info


def settings_record(args: argparse.Namespace) -> dict:
    """A script's arguments as its report keeps them (paths as text; the kernels apart, under "kernels")."""
    skipped = ("out", "kernels", *KERNEL_SETTINGS)
    return {k: v for k, v in vars(args).items() if k not in skipped} | {"out": str(args.out)}


class Report:
    """The JSON report, rewritten whole after every entry."""

    def __init__(self, path: Path, header: dict) -> None:
        self.path, self.data = path, {**header, "errors": []}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")

    def add(self, section: str, label: str, measure: Callable[[], dict]) -> None:
        """Append measure()'s entry to `section`, or its error (the run goes on either way)."""
        try:
            self.data.setdefault(section, []).append(measure())
        except Exception as exc:  # a failed entry is a result too; later entries may still run
            self.data["errors"].append({"section": section, "label": label, "error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc(limit=4)})
            print(f"{section} {label}: FAILED {type(exc).__name__}: {exc}", flush=True)
        self.save()


def run_model_part(report: Report, args: argparse.Namespace, device: torch.device, ceilings: dict) -> None:
    opts = {"warmup": args.warmup, "reps": args.reps}
    with tempfile.TemporaryDirectory() as scratch:
        model = build_model(write_config_files(Path(scratch) / args.preset, args.preset), device, DTYPES[args.dtype],
                            choices=args.kernels)
    report.data["kernels"] = kernels_record(args.kernels, model)
    for batch in args.batch_sizes:
        report.add("talker_step", f"batch {batch}", lambda: talker_step(model, batch, args.context, ceilings, opts))
        print(f"talker step batch {batch} done", flush=True)
    for batch in args.batch_sizes:
        report.add("predictor_frame", f"batch {batch}", lambda: predictor_frame(model, batch, ceilings, opts))
        print(f"code predictor batch {batch} done", flush=True)


def run_codec_part(report: Report, args: argparse.Namespace, device: torch.device, ceilings: dict) -> None:
    opts = {"chunk_frames": args.chunk_frames, "full_frames": args.full_frames,
            "codec_warmup": args.codec_warmup, "codec_reps": args.codec_reps}
    decoder = build_codec(args.preset, device, DTYPES[args.dtype], choices=args.kernels)
    for batch in args.codec_batch_sizes:
        report.add("codec", f"batch {batch}", lambda: codec_batch(decoder, batch, ceilings, opts))
        print(f"codec batch {batch} done", flush=True)
    # Capture attempts last: a failed capture can leave the CUDA context unusable.
    for batch in args.codec_batch_sizes:
        report.add("codec_graph", f"batch {batch}", lambda: codec_graph_probe(decoder, batch, opts))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", nargs="+", choices=("model", "codec"), default=["model", "codec"])
    parser.add_argument("--preset", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--codec-batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=256, help="cached tokens per sequence in a talker step")
    parser.add_argument("--chunk-frames", type=int, default=8, help="frames per streaming codec chunk")
    parser.add_argument("--full-frames", type=int, default=48, help="frames per full codec decode")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--codec-warmup", type=int, default=2)
    parser.add_argument("--codec-reps", type=int, default=5)
    parser.add_argument("--copy-mib", type=int, default=2048, help="bytes copied to measure bandwidth, MiB")
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--commit", help="the commit measured (recorded in the report)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    add_kernel_arguments(parser)
    args = parser.parse_args(argv)
    args.kernels = kernel_choices(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ceilings = measure_ceilings(device, args.copy_mib * 2**20, args.gemm_size)
    header = {"benchmark": "gpu_micro", "preset": args.preset, "dtype": args.dtype, "weights": "random, in memory",
              "environment": environment(device, args.commit), "ceilings": ceilings,
              "settings": settings_record(args), "kernels": kernels_record(args.kernels)}
    report = Report(args.out, header)
    print(f"copy {ceilings['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"GEMM {ceilings['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)
    with torch.inference_mode():
        if "model" in args.parts:
            run_model_part(report, args, device, ceilings)
        if "codec" in args.parts:
            run_codec_part(report, args, device, ceilings)
    return 1 if report.data["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
