"""The short table of a `voxmesh bench` run of the whole mesh (loadtest/gpu/gpu_mesh_run.sh), for RESULTS-GPU.md.

Reads the bench JSON documents and, when given, the GPU samples (`nvidia-smi --query-gpu=... --format=csv`) and two
`ps` snapshots of the mesh's processes (`pid times args`, taken before and after the bench), and prints markdown:
one row per load level with the figures that say where a request's time goes, then the GPU and CPU use.

Derived columns: frames/s = audio seconds per second x 12.5 (the codec's 80 ms frames); ms/frame = the median
interval between audio chunks / chunk_frames (8: every chunk after the first carries 8 frames, except a shorter
last one), i.e. the mesh's decode step time as a client sees it.

    python -m loadtest.gpu.gpu_mesh_table bench_c1.json bench_load.json [--gpu-samples gpu.csv]
        [--cpu-before ps0.txt --cpu-after ps1.txt --bench-wall-s S] [--decode-stats decode_stats.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

from loadtest.bench.stages import STAGES
from messages.audio_format import FRAMES_PER_SECOND

FRAMES_PER_AUDIO_S = FRAMES_PER_SECOND
CHUNK_FRAMES = 8


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def level_rows(document: dict) -> list[str]:
    """Markdown rows, one per level of every target of one bench document."""
    rows = []
    for target in document["targets"]:
        for level in target["levels"]:
            s, spec = level["summary"], level["level"]
            name = f"open {spec['load']:g}/s" if spec["mode"] == "open" else f"closed x{spec['load']:g}"
            interval = s["chunk_interval_s"]["median"]
            per_frame = None if interval is None else interval / CHUNK_FRAMES
            rtf = s["rtf"]["median"]
            cont = "-" if s["continuous_share"] is None else f"{s['continuous_share']:.0%}"
            errors = ", ".join(f"{code} {count}" for code, count in sorted(s["errors"].items())) or "-"
            rows.append(f"| {name} | {s['num_completed']}/{s['num_requests']} | {s['requests_per_s']:.2f} | "
                        f"{s['audio_s_per_s']:.2f} | {s['audio_s_per_s'] * FRAMES_PER_AUDIO_S:.1f} | "
                        f"{_ms(s['first_packet_s']['median'])} / {_ms(s['first_packet_s']['p95'])} | "
                        f"{_ms(s['latency_s']['median'])} | {_ms(per_frame)} | "
                        f"{'-' if rtf is None else f'{rtf:.2f}'} | {cont} | {errors} |")
    return rows


def stage_rows(document: dict) -> list[str]:
    """Markdown rows of each level's first packets by stage (p50 / p95 ms), for levels the bench broke down."""
    rows = []
    for target in document["targets"]:
        for level in target["levels"]:
            stages, spec = level.get("first_packet_stages"), level["level"]
            if not stages:
                continue
            name = f"open {spec['load']:g}/s" if spec["mode"] == "open" else f"closed x{spec['load']:g}"
            cells = " | ".join(f"{_ms(stages[stage]['median'])} / {_ms(stages[stage]['p95'])}" for stage in STAGES)
            rows.append(f"| {name} | {stages['num_requests']} | {cells} |")
    return rows


def bench_table(documents: list[dict]) -> list[str]:
    first = documents[0]
    lines = [f"{first['length']} ({first['length_mode']}); commit {first['meta'].get('commit')}, "
             f"{first['meta']['date']}",
             "",
             "| level | ok/sent | req/s | audio s/s | frames/s | first packet p50 / p95 ms | latency p50 ms | "
             "ms/frame (chunk interval / 8) | RTF p50 | continuous | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for document in documents:
        lines += level_rows(document)
    stages = [row for document in documents for row in stage_rows(document)]
    if stages:
        lines += ["", "First packet by stage, p50 / p95 ms (loadtest/bench/stages.py: from the client's start to its "
                      "first audio, through the mesh's lifecycle events):", "",
                  f"| level | requests | {' | '.join(STAGES)} |", "|---|---|" + "---|" * len(STAGES)] + stages
    return lines


def gpu_summary(path: Path) -> str:
    """Mean/max GPU utilization, peak memory and mean power over the samples (taken during the bench only)."""
    with path.open() as handle:
        rows = [{key.strip(): value.strip() for key, value in row.items()} for row in csv.DictReader(handle)]

    def numbers(prefix: str) -> list[float]:
        column = next((key for key in (rows[0] if rows else {}) if key.startswith(prefix)), None)
        found = [re.match(r"[\d.]+", row[column]) for row in rows] if column else []
        return [float(match.group()) for match in found if match]

    util, memory, power = numbers("utilization.gpu"), numbers("memory.used"), numbers("power.draw")
    if not util:
        return f"GPU samples: none readable in {path.name}"
    return (f"GPU during the bench ({len(util)} samples): utilization mean {sum(util) / len(util):.0f}% "
            f"(max {max(util):.0f}%), memory used max {max(memory, default=0):.0f} MiB, "
            f"power mean {sum(power) / len(power) if power else 0:.0f} W")


def _cpu_seconds(path: Path) -> dict[str, float]:
    """`pid times args` lines -> {process name: CPU seconds}; names from `services.cli serve X` or the binary."""
    seconds: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        serve = re.search(r"services\.cli (serve \w+|up)", parts[2])
        name = serve.group(1) if serve else Path(parts[2].split()[0]).name
        seconds[name] = seconds.get(name, 0.0) + float(parts[1])
    return seconds


def cpu_summary(before: Path, after: Path, wall_s: float) -> str:
    """CPU seconds each mesh process spent during the bench, as cores busy over the bench's wall time."""
    start, end = _cpu_seconds(before), _cpu_seconds(after)
    parts = [f"{name} {(end[name] - start.get(name, 0.0)) / wall_s:.2f}" for name in sorted(end)]
    return f"CPU cores busy during the bench ({wall_s:.0f} s wall; ps whole seconds): " + ", ".join(parts)


def decode_summary(path: Path) -> str:
    """The decode engine's step counters from loadtest/gpu/gpu_mesh_stats.py's JSON."""
    try:
        stats = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return f"decode STATS: not read ({error})"
    mean = stats.get("mean_batch_size")
    summary = (f"decode engine over the whole run (warm-ups included): {stats.get('steps')} steps, "
               f"{stats.get('frames')} frames, mean batch {'-' if mean is None else f'{mean:.2f}'}, "
               f"max batch {stats.get('max_batch_size')}, preemptions {stats.get('preemptions')}, "
               f"step errors {stats.get('step_errors')}"
               + (f", loop work held for a launch {stats['launch_waits']}x" if "launch_waits" in stats else ""))
    for title, timings in (("steps (device, idle stream, host launch)", stats.get("step_seconds", {})),
                           ("voice prompts", stats.get("voice_prompt_seconds", {})),
                           ("vocoder codec", stats.get("vocoder", {}).get("codec_seconds", {}))):
        timed = {part: t for part, t in timings.items() if t.get("count")}
        if timed:  # by part: where a cloned voice's first packet, or any chunk's audio, waits
            parts = [f"{part} {t['count']}x p50 {t['p50_ms']:.1f} / p95 {t['p95_ms']:.1f} ms"
                     for part, t in timed.items()]
            summary += f"; {title} " + ", ".join(sorted(parts))
    vocoder = stats.get("vocoder", {})
    if vocoder.get("codec_passes"):  # how many passes its calls ran, and how full: what the padding cost
        calls = max(1, vocoder.get("codec_calls", 0))  # a call in progress has run passes before it counts
        summary += (f"; codec passes {vocoder['codec_passes']} ({vocoder['codec_passes'] / calls:.2f} a "
                    f"call), frames {vocoder['codec_row_frames']} of {vocoder['codec_padded_row_frames']} row-frames "
                    "run")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("documents", type=Path, nargs="+", help="bench JSON files")
    parser.add_argument("--gpu-samples", type=Path, help="nvidia-smi CSV taken during the bench")
    parser.add_argument("--cpu-before", type=Path, help="ps snapshot (pid times args) before the bench")
    parser.add_argument("--cpu-after", type=Path, help="the same after the bench")
    parser.add_argument("--decode-stats", type=Path, help="loadtest/gpu/gpu_mesh_stats.py's JSON")
    parser.add_argument("--bench-wall-s", type=float, help="the bench's wall time, for --cpu-*")
    args = parser.parse_args(argv)
    documents = []
    for path in args.documents:
        try:
            documents.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            print(f"gpu_mesh_table: skipping {path}: {error}", file=sys.stderr)
    lines = bench_table(documents) if documents else ["no bench document could be read"]
    if args.gpu_samples is not None and args.gpu_samples.is_file():
        lines += ["", gpu_summary(args.gpu_samples)]
    if args.cpu_before and args.cpu_after and args.bench_wall_s:
        lines += ["", cpu_summary(args.cpu_before, args.cpu_after, args.bench_wall_s)]
    if args.decode_stats is not None and args.decode_stats.is_file():
        lines += ["", decode_summary(args.decode_stats)]
    print("\n".join(lines))
    return 0 if documents else 1


if __name__ == "__main__":
    sys.exit(main())
