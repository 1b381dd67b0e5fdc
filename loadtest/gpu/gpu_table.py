"""Short markdown tables from the GPU reports (gpu_micro, engine_step_bench, ucx_kv_handoff).

    python -m loadtest.gpu.gpu_table micro_model.json micro_codec.json engine_06b.json ucx.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _ms(entry: dict | None, key: str = "median_ms") -> str:
    return "-" if not entry or key not in entry else f"{entry[key]:.2f}"


def _kernels(entry: dict) -> str:
    launches = entry.get("launches") or {}
    count = launches.get("cuda_kernels")
    return str(count) if count is not None else f"{launches.get('aten_ops', '-')} ops"


def _ratio(measured: dict | None, floor: float) -> str:
    return "-" if not measured or not floor else f"{measured['median_ms'] / floor:.0f}x"


def model_tables(report: dict) -> list[str]:
    lines = ["| batch | talker step eager ms | kernels | decode-only graph ms | floor ms (weights / +KV) | graph/floor "
             "| CP frame eager ms (greedy / sampled) | kernels (greedy / sampled) | CP graph ms (greedy / sampled) "
             "| CP floor ms | graph/floor |", "|" + "---|" * 11]
    predictor = {row["batch"]: row for row in report.get("predictor_frame", [])}
    for talker in report.get("talker_step", []):
        cp = predictor.get(talker["batch"], {})
        variant = talker["decode_only_variant"]
        greedy, sampled = cp.get("greedy", {}), cp.get("sampled", {})
        lines.append(
            f"| {talker['batch']} | {_ms(talker['forward']['eager'])} | {_kernels(talker['forward'])} "
            f"| {_ms(variant.get('graph'))} | {talker['weights_only_floor_ms']:.3f} / {talker['floor_ms']:.3f} "
            f"| {_ratio(variant.get('graph'), talker['floor_ms'])} "
            f"| {_ms(greedy.get('eager'))} / {_ms(sampled.get('eager'))} "
            f"| {_kernels(greedy) if greedy else '-'} / {_kernels(sampled) if sampled else '-'} "
            f"| {_ms(greedy.get('graph'))} / {_ms(sampled.get('graph'))} | {cp.get('floor_ms', 0):.3f} "
            f"| {_ratio(sampled.get('graph'), cp.get('floor_ms', 0))} |")
    return lines


def codec_tables(report: dict) -> list[str]:
    lines = ["| streams | chunk: ms/call | ms/frame | kernels | full: ms/call | ms/frame | kernels "
             "| forward only ms/call | graph ms/call | floor ms/frame (chunk) |", "|" + "---|" * 10]
    graphs = {row["batch"]: row for row in report.get("codec_graph", [])}
    for row in report.get("codec", []):
        chunk, full = row["stream_chunk"], row["full"]
        graph = graphs.get(row["batch"], {}).get("graph")
        lines.append(
            f"| {row['batch']} | {_ms(chunk['eager'])} | {_ms(chunk['eager'], 'per_frame_ms')} | {_kernels(chunk)} "
            f"| {_ms(full['eager'])} | {_ms(full['eager'], 'per_frame_ms')} | {_kernels(full)} "
            f"| {_ms(row['forward']['eager'])} | {_ms(graph)} | {chunk['floor_per_frame_ms']:.4f} |")
    return lines


def engine_table(report: dict) -> list[str]:
    device = report.get("device") or report.get("environment", {}).get("device", "")
    lines = [f"engine step loop ({report.get('model') or report.get('preset')}, {device})",
             "| batch | ms/step | frames/s | talker ms | CP ms | sampling ms | other ms | outside forward |",
             "|" + "---|" * 8]
    for row in report["results"]:
        lines.append(f"| {row['batch']} | {row['step_ms']:.2f} | {row['frames_per_s']:.1f} "
                     f"| {row['talker_forward_ms']:.2f} | {row['code_predictor_forward_ms']:.2f} "
                     f"| {row['sampling_ms']:.2f} | {row['other_ms']:.2f} | {100 * row['outside_forward_share']:.0f}% |")
    return lines


def ucx_table(report: dict) -> list[str]:
    lines = ["| UCX_TLS | mode | tokens | MB | median ms | GB/s | checked equal |", "|" + "---|" * 7]
    for run in report["runs"]:
        for row in run["trials"]:
            rate = f"{row['bandwidth_gb_per_s']:.1f}" if row["bandwidth_gb_per_s"] else "-"
            lines.append(f"| {run['ucx_tls']} | {row['mode']} | {row['tokens']} | {row['bytes'] / 1e6:.1f} "
                         f"| {row['median_ms']:.3f} | {rate} | {row['all_equal']} ({row['checked']}) |")
    return lines


def tables(report: dict) -> list[str]:
    kind = report.get("benchmark", "")
    if kind == "gpu_micro":
        out = model_tables(report) if "talker_step" in report else []
        out += codec_tables(report) if "codec" in report else []
        return out + [f"errors: {len(report['errors'])}"] if report["errors"] else out
    if "engine" in kind:
        return engine_table(report)
    if kind == "ucx_kv_handoff":
        return ucx_table(report)
    return [f"(unknown report {kind!r})"]


def main(argv: list[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        path = Path(name)
        if not path.is_file():
            print(f"{name}: missing")
            continue
        print(f"\n## {path.name}")
        print("\n".join(tables(json.loads(path.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
