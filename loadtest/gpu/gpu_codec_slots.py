"""The vocoder's codec call before and after fixed slots: eager `decode_chunks` against the slot decoder's steps.

For each number of streams (`--batch-sizes`) and chunk length (`--chunk-frames`), one call decodes one chunk of
every stream, states advancing, samples brought to the host (as the vocoder publishes them):
- old_eager: `CodecDecoder.decode_chunks` over per-request states (stacked and scattered per call), then each
  row copied to the host, as the vocoder did before slots;
- slots_eager: `SlotDecoder.decode_chunks(..., to_host=True)` with capture off (padded steps run eagerly);
- slots_graphed: the same with every (rows bucket, frames) step captured as a CUDA graph at start-up (CUDA only).
Each entry holds the median and best ms per call and the audio seconds made per second, and a check that the three
give the same audio for the same codes (3 chunks per stream from fresh states). Warm-up (capturing every shape,
as the vocoder does before it reports ready) is timed once.

    python3 -m loadtest.gpu.gpu_codec_slots --out slots.json --device cuda --dtype bfloat16 [--preset 0.6b] \
        [--triton-conv false]
    python3 -m loadtest.gpu.gpu_codec_slots --out slots.json --device cpu --tiny --batch-sizes 2 --reps 1   # smoke
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from loadtest.gpu.gpu_common import time_call, top_kernels
from loadtest.gpu.gpu_micro import (DTYPES, Report, add_model_arguments, environment, settings_record,
                                    settle_model_arguments)
from loadtest.gpu.gpu_models import add_kernel_arguments, build_codec, kernel_choices, kernels_record
from services.model.codec import CodecDecoder
from services.model.codec.slot_decoder import SlotDecoder

CHECK_CHUNKS = 3
FRAME_SECONDS = 0.08  # 1920 samples at 24 kHz


def _codes(decoder: CodecDecoder, streams: int, frames: int, seed: int) -> list[torch.Tensor]:
    """Host code chunks, as the vocoder gets them from the bus."""
    generator = torch.Generator().manual_seed(seed)
    shape = (frames, decoder.config.num_quantizers)
    return [torch.randint(0, decoder.config.codebook_size, shape, generator=generator) for _ in range(streams)]


def _timed(fn, device: torch.device, streams: int, frames: int, args: argparse.Namespace) -> dict:
    timing = time_call(fn, device, args.warmup, args.reps)
    return {**timing, "audio_s_per_s": streams * frames * FRAME_SECONDS / (timing["median_ms"] / 1000)}


def old_call(decoder: CodecDecoder, states: list, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    return [audio.to("cpu") for audio in decoder.decode_chunks(states, chunks)]


def slots_call(slots: SlotDecoder, ids: list[int], chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    return slots.decode_chunks(ids, chunks, to_host=True)


def check(decoder: CodecDecoder, paths: dict[str, SlotDecoder], streams: int, frames: int, tolerance: float) -> dict:
    """Decode CHECK_CHUNKS chunks per stream from fresh states on every path; compare each with the old path."""
    chunks = [_codes(decoder, streams, frames, seed=1000 + i) for i in range(CHECK_CHUNKS)]
    states = [decoder.new_stream() for _ in range(streams)]
    reference = [torch.cat(parts) for parts in zip(*(old_call(decoder, states, c) for c in chunks))]
    spread = float(torch.cat(reference).std())
    result: dict = {"reference_std": spread, "tolerance_rms_over_std": tolerance}
    for name, slots in paths.items():
        ids = [slots.acquire() for _ in range(streams)]
        try:
            got = [torch.cat(parts) for parts in zip(*(slots_call(slots, ids, c) for c in chunks))]
        finally:
            for slot in ids:
                slots.release(slot)
        diff = torch.cat(got) - torch.cat(reference)
        rms = float(diff.pow(2).mean().sqrt())
        result[name] = {"max_abs_diff": float(diff.abs().max()), "rms_over_std": rms / spread,
                        "equal": rms <= tolerance * spread}
    return result


def measure(decoder: CodecDecoder, paths: dict[str, SlotDecoder], streams: int, frames: int,
            args: argparse.Namespace) -> dict:
    device = decoder.device
    chunks = _codes(decoder, streams, frames, seed=streams * 100 + frames)
    states = [decoder.new_stream() for _ in range(streams)]
    entry = {"streams": streams, "chunk_frames": frames,
             "old_eager": _timed(lambda: old_call(decoder, states, chunks), device, streams, frames, args)}
    for name, slots in paths.items():
        ids = [slots.acquire() for _ in range(streams)]
        try:
            entry[name] = _timed(lambda: slots_call(slots, ids, chunks), device, streams, frames, args)
        finally:
            for slot in ids:
                slots.release(slot)
    tolerance = 1e-3 if decoder.dtype == torch.float32 else 0.1  # bfloat16: test_codec_parity.py's criterion
    entry["check"] = check(decoder, paths, streams, frames, tolerance)
    return entry


def build_paths(decoder: CodecDecoder, args: argparse.Namespace, report: Report) -> dict[str, SlotDecoder]:
    """The eager slot decoder, and on CUDA the graphed one (its warm-up, every capture, timed)."""
    max_streams, max_frames = max(args.batch_sizes), max(args.chunk_frames)
    paths = {"slots_eager": SlotDecoder(decoder, max_streams=max_streams, max_rows=args.max_rows,
                                        max_chunk_frames=max_frames, capture=False)}
    if decoder.device.type == "cuda":
        graphed = SlotDecoder(decoder, max_streams=max_streams, max_rows=args.max_rows, max_chunk_frames=max_frames,
                              capture=True)
        begin = time.perf_counter()
        graphed.warm_up()
        report.data["warm_up"] = {"seconds": time.perf_counter() - begin, "graphs": graphed.num_graphs,
                                  "shapes": sum(map(len, graphed.rows_by_frames.values())),
                                  "capture_failures": {f"{r}x{n}": why for (r, n), why in
                                                       graphed.capture_failures.items()},
                                  "gpu_memory_reserved_gib": torch.cuda.memory_reserved(decoder.device) / 2**30}
        paths["slots_graphed"] = graphed
    else:
        report.data["warm_up"] = {"graphs": 0, "reason": "CUDA graphs need a CUDA device"}
    report.save()
    return paths


def kernels_of(slots: SlotDecoder, decoder: CodecDecoder, streams: int, frames: int) -> list[dict]:
    """Which kernels one graphed call of the largest shape spends its device time on (printed and kept)."""
    chunks = _codes(decoder, streams, frames, seed=7)
    ids = [slots.acquire() for _ in range(streams)]
    try:
        ranked = top_kernels(lambda: slots_call(slots, ids, chunks), decoder.device, limit=25)
    finally:
        for slot in ids:
            slots.release(slot)
    print(f"kernels of one graphed call, {streams} streams x {frames} frames, by device time:")
    for entry in ranked:
        print(f"  {entry['total_us']:9.1f} us {entry['count']:5d}x {entry['kernel']}")
    return ranked


def ops_of(decoder: CodecDecoder, streams: int, frames: int) -> list[dict]:
    """Each torch op of one eager call (the graphed call runs the same ones) by input shape, most device time of its
    own kernels first: which op (a convolution, a copy, a concatenation) a kernel in `kernels_of`'s table belongs to."""
    from torch.profiler import ProfilerActivity, profile

    slots = SlotDecoder(decoder, max_streams=streams, max_rows=streams, max_chunk_frames=frames, capture=False)
    chunks = _codes(decoder, streams, frames, seed=8)
    ids = [slots.acquire() for _ in range(streams)]
    slots_call(slots, ids, chunks)  # warm: cuDNN picks its algorithms on the first call of a shape
    torch.cuda.synchronize(decoder.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        slots_call(slots, ids, chunks)
        torch.cuda.synchronize(decoder.device)
    rows = [{"op": e.key, "input_shapes": str(e.input_shapes)[:160], "count": e.count,
             "device_us": round(e.self_device_time_total, 1)}
            for e in prof.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0]
    rows.sort(key=lambda row: -row["device_us"])
    print(f"ops of one eager call, {streams} streams x {frames} frames, by their own kernels' device time:")
    for row in rows[:40]:
        print(f"  {row['device_us']:9.1f} us {row['count']:4d}x {row['op']} {row['input_shapes']}")
    return rows


def table(report: dict) -> list[str]:
    """The results as a markdown table: ms per call of each path, and the faster slot path against the old one."""
    lines = ["| streams | frames | old eager ms | slots eager ms | graphed ms | best audio-s/s | speed-up | equal |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report.get("results", []):
        old, eager, graphed = row["old_eager"], row["slots_eager"], row.get("slots_graphed")
        best = graphed or eager
        graphed_ms = f"{graphed['median_ms']:.2f}" if graphed else "-"
        equal = all(v["equal"] for v in row["check"].values() if isinstance(v, dict))
        lines.append(f"| {row['streams']} | {row['chunk_frames']} | {old['median_ms']:.2f} | {eager['median_ms']:.2f} "
                     f"| {graphed_ms} | {best['audio_s_per_s']:.1f} | {old['median_ms'] / best['median_ms']:.1f}x "
                     f"| {equal} |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report")
    add_model_arguments(parser)
    parser.add_argument("--chunk-frames", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--max-rows", type=int, default=64, help="largest row bucket (the vocoder's max batch)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--commit", help="the commit measured (recorded in the report)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    add_kernel_arguments(parser)
    args = settle_model_arguments(parser.parse_args(argv))
    args.kernels = kernel_choices(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    header = {"benchmark": "gpu_codec_slots", "preset": args.preset, "dtype": args.dtype, "weights": "random",
              "environment": environment(device, args.commit),
              "settings": settings_record(args), "kernels": kernels_record(args.kernels)}
    report = Report(args.out, header)
    decoder = build_codec(args.preset, device, DTYPES[args.dtype], choices=args.kernels)
    paths = build_paths(decoder, args, report)
    for streams in args.batch_sizes:
        for frames in args.chunk_frames:
            report.add("results", f"{streams} x {frames}", lambda: measure(decoder, paths, streams, frames, args))
            print(f"{streams} streams x {frames} frames done", flush=True)
    print("\n".join(table(report.data)), flush=True)
    if "slots_graphed" in paths:
        report.data["top_kernels"] = kernels_of(paths["slots_graphed"], decoder, max(args.batch_sizes),
                                                max(args.chunk_frames))
        report.data["ops"] = ops_of(decoder, max(args.batch_sizes), max(args.chunk_frames))
        report.save()
    checks_pass = all(v["equal"] for row in report.data.get("results", [])
                      for v in row["check"].values() if isinstance(v, dict))
    return 0 if checks_pass and not report.data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
