"""What a `voxmesh bench` run reports: its headline verdicts (the highest open-loop rate sustained, ratios between
two targets), the JSON document (what ran: command, commit, date, machine, settings; and what it measured), and a
short fixed-width table of that document for a terminal."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence

from loadtest.bench.audible import RANDOM_WEIGHTS_NOTE, audible_threshold_label
from loadtest.bench.gate import Gate, sustained_index
from loadtest.bench.loadgen import LevelResult, Target
from loadtest.bench.metrics import LevelSummary, Summary
from loadtest.bench.stages import STAGES
from loadtest.bench.workload import REPO_ROOT

SCHEMA = "voxmesh.bench/1"
# (name in the report, how to read it from a summary)
_COMPARED = {
    "requests_per_s": lambda s: s.requests_per_s,
    "audio_s_per_s": lambda s: s.audio_s_per_s,
    "goodput_per_s": lambda s: s.goodput_per_s,
    "continuous_share": lambda s: s.continuous_share,
    "first_packet_p50_s": lambda s: s.first_packet_s.median,
    "first_packet_p95_s": lambda s: s.first_packet_s.p95,
    "latency_p95_s": lambda s: s.latency_s.p95,
    "rtf_median": lambda s: s.rtf.median,
}


def is_sustained(summary: LevelSummary, p95_first_packet_bound_s: float) -> bool:
    """Every request sent and completed, no playback gap in any stream, and p95 first packet within the bound."""
    p95 = summary.first_packet_s.p95
    return (summary.num_completed > 0 and summary.num_failed == 0 and summary.num_not_sent == 0
            and summary.num_gaps == 0 and p95 is not None and p95 <= p95_first_packet_bound_s)


def max_sustained_rate(results: Sequence[LevelResult], p95_first_packet_bound_s: float) -> float | None:
    """The highest open-loop arrival rate that was sustained (None when none was, or no open level ran)."""
    rates = [result.level.load for result in results
             if result.level.mode == "open" and is_sustained(result.summary, p95_first_packet_bound_s)]
    return max(rates, default=None)


def ratio(candidate: float | None, baseline: float | None) -> float | None:
    """candidate / baseline, None when either is missing or the baseline is zero."""
    if candidate is None or baseline is None or baseline == 0:
        return None
    return candidate / baseline


def compare_levels(baseline: Sequence[LevelResult], candidate: Sequence[LevelResult]) -> list[dict]:
    """Per level (same order on both sides): each compared figure of both targets and candidate/baseline."""
    rows = []
    for base, cand in zip(baseline, candidate, strict=True):
        figures = {}
        for name, read in _COMPARED.items():
            a, b = read(base.summary), read(cand.summary)
            figures[name] = {"baseline": a, "candidate": b, "ratio": ratio(b, a)}
        rows.append({"level": base.level.to_dict(), "figures": figures})
    return rows


def _run_quietly(command: list[str]) -> str | None:
    """stdout of a short local command, or None when it is missing or fails (the report still gets written)."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> dict:
    """HEAD and whether the working tree differs from it (figures from a dirty tree say so). `VOXMESH_COMMIT`, where
    set, names the commit instead: a copied tree (the GPU machine's) can carry a stale .git."""
    named = os.environ.get("VOXMESH_COMMIT")
    if named:
        return {"commit": named, "dirty": None}
    head = _run_quietly(["git", "rev-parse", "HEAD"])
    status = _run_quietly(["git", "status", "--porcelain", "--untracked-files=no"])
    return {"commit": head, "dirty": None if status is None else bool(status)}


def machine() -> dict:
    """Where the figures were taken: host, CPU, core count and accelerators (nvidia-smi, when present)."""
    gpus = _run_quietly(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return {"hostname": platform.node(), "platform": platform.platform(), "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "gpus": gpus.splitlines() if gpus else []}


def meta(command: str) -> dict:
    return {"tool": "voxmesh bench", "command": command,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **git_commit(),
            "machine": machine()}


def max_sustained_rps(results: Sequence[LevelResult], gate: Gate) -> dict:
    """The public method's headline: the highest open rate that passed the gate with every lower one passing,
    with its first audible sample's p50/p95/p99 (and TTFB's), or `rps` None when the lowest rate failed."""
    opened = sorted((result for result in results if result.level.mode == "open"), key=lambda r: r.level.load)
    index = sustained_index([gate.verdict(result.summary).passed for result in opened])
    if index is None:
        return {"rps": None, "first_audible_s": None, "ttfb_s": None}
    summary = opened[index].summary
    return {"rps": opened[index].level.load, "first_audible_s": _percentiles(summary.first_audible_s),
            "ttfb_s": _percentiles(summary.ttfb_s)}


def _percentiles(summary: Summary) -> dict:
    return {"p50": summary.median, "p95": summary.p95, "p99": summary.p99}


def figure_labels(transport: str, length_mode: str, response_format: str = "pcm",
                  sample_rate: int | None = None) -> dict:
    """What every figure of a target was measured with (the public method's labels): the audio's format and the
    rate asked (None: the format's own) among them."""
    return {"transport": transport, "length_mode": length_mode, "response_format": response_format,
            "sample_rate": sample_rate, "audible_threshold": audible_threshold_label(),
            "audible_note": RANDOM_WEIGHTS_NOTE}


def audio_label(labels: dict) -> str:
    """`pcm`, `mp3 at 16000 Hz`: the format and the rate asked (documents written before either was asked: pcm)."""
    rate = labels.get("sample_rate")
    return labels.get("response_format", "pcm") + ("" if rate is None else f" at {rate} Hz")


def target_section(target: Target, results: Sequence[LevelResult], p95_bound_s: float, warmup: dict,
                   stages: Sequence[dict | None] | None = None, gate: Gate | None = None,
                   length_mode: str = "natural", response_format: str = "pcm",
                   sample_rate: int | None = None) -> dict:
    """One target's levels; `stages`, when the run read them, each level's first packets by stage (stages.py);
    open levels get the public method's gate verdict."""
    gate = gate or Gate()
    levels = []
    for number, result in enumerate(results):
        is_open = result.level.mode == "open"
        sustained = is_sustained(result.summary, p95_bound_s) if is_open else None
        level = {"level": result.level.to_dict(), "summary": result.summary.to_dict(), "sustained": sustained,
                 "gate": gate.verdict(result.summary).to_dict() if is_open else None}
        requests = result.requests_to_dicts()
        if stages is not None:
            level_stages = dict(stages[number] or {})
            by_request = level_stages.pop("by_request", {})
            level["first_packet_stages"] = level_stages or None
            for request in requests:
                request["first_packet_stages"] = by_request.get(request["request_id"])
        levels.append({**level, "requests": requests})
    return {"label": target.label, "url": target.url, "transport": target.transport, "warmup": warmup,
            "labels": figure_labels(target.transport, length_mode, response_format, sample_rate),
            "max_sustained_rate": max_sustained_rate(results, p95_bound_s),
            "max_sustained_rps": max_sustained_rps(results, gate), "levels": levels}


def comparison_section(baseline: Target, candidate: Target, baseline_results: Sequence[LevelResult],
                       candidate_results: Sequence[LevelResult], p95_bound_s: float) -> dict:
    """candidate/baseline ratios per level, and of the highest sustained rates."""
    base_rate = max_sustained_rate(baseline_results, p95_bound_s)
    cand_rate = max_sustained_rate(candidate_results, p95_bound_s)
    return {"baseline": baseline.label, "candidate": candidate.label,
            "max_sustained_rate": {"baseline": base_rate, "candidate": cand_rate, "ratio": ratio(cand_rate, base_rate)},
            "levels": compare_levels(baseline_results, candidate_results)}


def headline_rows(document: dict) -> Sequence[str]:
    """A short fixed-width table of every level of every target, for stdout."""
    rows = [f"{'target':<10} {'level':<14} {'ok/sent':>8} {'req/s':>7} {'audio/s':>8} {'fp p50':>8} {'fp p95':>8}"
            f" {'contin.':>7} {'goodput/s':>9}"]
    for target in document["targets"]:
        for level in target["levels"]:
            s, spec = level["summary"], level["level"]
            name = f"open {spec['load']:g}/s" if spec["mode"] == "open" else f"closed x{spec['load']:g}"
            fp = s["first_packet_s"]
            rows.append(f"{target['label']:<10} {name:<14} {s['num_completed']:>3g}/{s['num_requests']:<4g} "
                        f"{s['requests_per_s']:>7.2f} {s['audio_s_per_s']:>8.2f} {_ms(fp['median']):>8} "
                        f"{_ms(fp['p95']):>8} {_share(s['continuous_share']):>7} {s['goodput_per_s']:>9.2f}")
            if level.get("first_packet_stages"):
                rows.append(f"{'':<10} {'':<14} first packet by stage, p50 / p95: "
                            f"{stage_line(level['first_packet_stages'])}")
        rows.append(f"{target['label']}: highest open-loop rate sustained (no errors, no gaps, p95 first packet <= "
                    f"{document['config']['p95_first_packet_bound_s'] * 1000:.0f} ms): {target['max_sustained_rate']}")
        rows.extend(public_rows(target))
    return rows


def public_rows(target: dict) -> list[str]:
    """The public method's lines of one target: each open level's audible first audio, underruns and gate, then
    max sustained rps, all labelled with the transport, the length mode and the audible threshold."""
    labels = target.get("labels")
    opened = [level for level in target["levels"] if level["level"]["mode"] == "open"]
    if labels is None or not opened:
        return []
    rows = [f"{target['label']} public method ({labels['transport']}, {audio_label(labels)}, "
            f"{labels['length_mode']} length, audible >= "
            f"{labels['audible_threshold']}; {labels['audible_note']}):"]
    for level in opened:
        s = level["summary"]
        audible, ttfb = s["first_audible_s"], s["ttfb_s"]
        gate = level["gate"]
        verdict = "pass" if gate["passed"] else "FAIL " + ",".join(gate["reasons"])
        rows.append(f"  open {level['level']['load']:g}/s: audible p50/p95/p99 {_ms(audible['median'])}/"
                    f"{_ms(audible['p95'])}/{_ms(audible['p99'])}, ttfb p95 {_ms(ttfb['p95'])}, underruns "
                    f"{s['num_underrun_events']:g} (stall {s['total_stall_s'] * 1000:.0f} ms, >10 ms gaps "
                    f"{s['num_audible_gaps']:g}) | gate {verdict}")
    best = target["max_sustained_rps"]
    if best["rps"] is None:
        rows.append("  max sustained rps: none (the lowest rate failed the gate)")
    else:
        audible = best["first_audible_s"] or {"p50": None, "p95": None, "p99": None}
        spread = f" (trials: min {best['min']:g}, max {best['max']:g})" if "min" in best else ""
        rows.append(f"  max sustained rps: {best['rps']:g}{spread}, audible first audio p50/p95/p99 "
                    f"{_ms(audible['p50'])}/{_ms(audible['p95'])}/{_ms(audible['p99'])}")
    return rows


def stage_line(stages: dict) -> str:
    """`connect 1/2 · submit 1/3 · ...` in milliseconds: a level's `first_packet_stages` in one line."""
    return " · ".join(f"{stage} {_ms(stages[stage]['median'], unit='')}/{_ms(stages[stage]['p95'])}"
                      for stage in STAGES)


def _ms(seconds: float | None, unit: str = "ms") -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}{unit}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
