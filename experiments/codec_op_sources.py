"""Where a codec pass's launches come from: every torch op of one eager slot-decoder pass, grouped by the line of
voxmesh code that called it (the innermost `services/` frame of its stack), with its count and its kernels' device
time. A graphed pass replays the same launches, and a short pass is bound by their number (~1.5 ms for a 1-row pass on
an H200, loadtest/results/history-gpu-*.md), so this names the lines whose launches to fold next.

    python3 -m experiments.codec_op_sources --out F [--rows 1] [--frames 2] [--preset 0.6b] [--commit C]
    python3 -m experiments.codec_op_sources --out F --device cpu --dtype float32 --preset tiny   # smoke: every op
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from loadtest.gpu.gpu_micro import DTYPES, environment
from loadtest.gpu.gpu_models import build_codec
from services.model.codec.slot_decoder import SlotDecoder


def _caller(event) -> str:
    """The innermost Python frame in voxmesh's services that the op ran under (the profiler's Python function events
    are its CPU parents)."""
    parent = event.cpu_parent
    while parent is not None:
        if "services/" in parent.name:
            return parent.name
        parent = parent.cpu_parent
    return "?"


def op_sources(rows: int, frames: int, preset: str, device: torch.device, dtype: torch.dtype) -> list[dict]:
    decoder = build_codec(preset, device, dtype)
    slots = SlotDecoder(decoder, max_streams=rows, max_rows=rows, max_chunk_frames=frames, capture=False)
    ids = [slots.acquire() for _ in range(rows)]
    codes = [torch.randint(0, decoder.config.codebook_size, (frames, decoder.config.num_quantizers))
             for _ in range(rows)]
    slots.decode_chunks(ids, codes, to_host=True)  # warm: cuDNN picks its algorithms on a shape's first call
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        slots.decode_chunks(ids, codes, to_host=True)
        synchronize()
    by_source: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if not event.name.startswith("aten::") or (device.type == "cuda" and event.self_device_time_total <= 0):
            continue  # an op that launched nothing itself (its children did); on the CPU every op counts
        entry = by_source[(event.name, _caller(event))]
        entry[0] += 1
        entry[1] += event.self_device_time_total
    ranked = [{"op": op, "source": source, "count": count, "device_us": round(us, 1)}
              for (op, source), (count, us) in by_source.items()]
    return sorted(ranked, key=lambda row: (-row["count"], -row["device_us"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--frames", type=int, default=2)
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    ranked = op_sources(args.rows, args.frames, args.preset, device, DTYPES[args.dtype])
    report = {"benchmark": "codec_op_sources", "rows": args.rows, "frames": args.frames, "preset": args.preset,
              "dtype": args.dtype, "environment": environment(device, args.commit),
              "launching_ops": sum(row["count"] for row in ranked), "ops": ranked}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{report['launching_ops']} launching ops in one {args.rows} x {args.frames} pass")
    for row in ranked[:40]:
        print(f"  {row['count']:4d}x {row['device_us']:8.1f} us  {row['op']:32s} {row['source']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
