"""The bench's JSON document: what ran (command, commit, date, machine, settings) and what it measured."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence

from loadtest.prompts import REPO_ROOT
from loadtest.runner import LevelResult, Target
from loadtest.verdict import compare_levels, is_sustained, max_sustained_rate, ratio

SCHEMA = "voxmesh.bench/1"


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
    """HEAD and whether the working tree differs from it (figures from a dirty tree say so)."""
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


def target_section(target: Target, results: Sequence[LevelResult], p95_bound_s: float, warmup: dict) -> dict:
    levels = []
    for result in results:
        sustained = is_sustained(result.summary, p95_bound_s) if result.level.mode == "open" else None
        levels.append({"level": result.level.to_dict(), "summary": result.summary.to_dict(),
                       "sustained": sustained, "requests": result.requests_to_dicts()})
    return {"label": target.label, "url": target.url, "warmup": warmup,
            "max_sustained_rate": max_sustained_rate(results, p95_bound_s), "levels": levels}


def comparison_section(baseline: Target, candidate: Target, baseline_results: Sequence[LevelResult],
                       candidate_results: Sequence[LevelResult], p95_bound_s: float) -> dict:
    """candidate/baseline ratios per level, and of the highest sustained rates."""
    base_rate = max_sustained_rate(baseline_results, p95_bound_s)
    cand_rate = max_sustained_rate(candidate_results, p95_bound_s)
    return {"baseline": baseline.label, "candidate": candidate.label,
            "max_sustained_rate": {"baseline": base_rate, "candidate": cand_rate, "ratio": ratio(cand_rate, base_rate)},
            "levels": compare_levels(baseline_results, candidate_results)}
