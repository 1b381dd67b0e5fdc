"""Several trials of the same bench, each with its own arrival seed (the configured one + 0, 1, 2...) and, with a
launcher, each on a fresh mesh (fresh_mesh.py) whose warm-up requests stay out of the figures; then one document
whose figures are the median of the trials with their min and max.

The combined document keeps the single run's shape, so the table and the plot read it unchanged: each target's
level `summary` holds, figure by figure, the median over the trials that ran that level (a sweep may stop at a
different rate in each), `summary_min` and `summary_max` the extremes, `num_trials` how many ran it, and `requests`
every trial's requests tagged with `trial`. A level's gate passed only if it passed in every trial that ran it.
`max_sustained_rps` is the median of the trials' (a trial where even the lowest rate failed counts as 0) with
min-max and each trial's. `trials.per_trial` keeps each trial's headline figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from loadtest.bench.fresh_mesh import MeshLauncher
from loadtest.bench.http_speech import endpoint_url
from loadtest.bench.loadgen import Progress
from loadtest.bench.sweep import BenchConfig, BenchError, run_bench

Pick = Callable[[Sequence[float]], float]


async def run_trials(config: BenchConfig, *, trials: int, launcher: MeshLauncher | None, command: str,
                     progress: Progress | None = None) -> dict:
    """`trials` bench runs (on a fresh mesh each with `launcher`), combined."""
    if trials < 1:
        raise BenchError("invalid_targets", f"--trials must be 1 or more, got {trials}")
    if launcher is not None and len(config.targets) != 1:
        raise BenchError("invalid_targets", "a fresh mesh per trial serves one target (no --compare-url)")
    documents = []
    for trial in range(trials):
        trial_config = replace(config, arrival_seed=config.arrival_seed + trial)
        if progress is not None and (trials > 1 or launcher is not None):
            progress.note(f"trial {trial + 1}/{trials}: arrival seed {trial_config.arrival_seed}"
                          + (", fresh mesh" if launcher is not None else ""))
        if launcher is None:
            documents.append(await run_bench(trial_config, command=command, progress=progress))
            continue
        async with launcher.running(f"trial{trial}") as mesh:
            target = trial_config.targets[0]
            target = replace(target, url=endpoint_url(mesh.gateway_url, target.transport))
            documents.append(await run_bench(replace(trial_config, targets=(target,), events_urls=(mesh.events_url,)),
                                             command=command, progress=progress))
    return documents[0] if trials == 1 and launcher is None else combine_trials(documents,
                                                                               fresh_mesh=launcher is not None)


def combine_trials(documents: Sequence[dict], *, fresh_mesh: bool) -> dict:
    """One document of several trials' (see the module)."""
    first = documents[0]
    combined = {key: value for key, value in first.items() if key not in ("targets", "comparison", "sweep")}
    combined["targets"] = [combine_target([document["targets"][number] for document in documents])
                           for number in range(len(first["targets"]))]
    combined["comparison"] = None
    combined["trials"] = {
        "count": len(documents), "fresh_mesh": fresh_mesh,
        "arrival_seeds": [document["config"]["arrival_seed"] for document in documents],
        "aggregate": "median of the trials, with min and max",
        "per_trial": [{"arrival_seed": document["config"]["arrival_seed"], "sweep": document.get("sweep"),
                       "comparison": document.get("comparison"),
                       "targets": [{key: target[key] for key in ("label", "url", "max_sustained_rate",
                                                                 "max_sustained_rps")}
                                   for target in document["targets"]]}
                      for document in documents]}
    return combined


def combine_target(sections: Sequence[dict]) -> dict:
    """One target's sections from each trial, as one section (see the module)."""
    by_level: dict[tuple, list[tuple[int, dict]]] = {}
    for trial, section in enumerate(sections):
        for level in section["levels"]:
            key = (level["level"]["mode"], level["level"]["load"])
            by_level.setdefault(key, []).append((trial, level))
    levels = [_combine_level(ran) for ran in by_level.values()]
    rates = [section["max_sustained_rate"] for section in sections]
    first = sections[0]
    return {**{key: first[key] for key in ("label", "transport", "warmup", "labels") if key in first},
            "url": [section["url"] for section in sections] if len(sections) > 1 else first["url"],
            "max_sustained_rate": _median_or_none(rates),
            "max_sustained_rps": combine_max_sustained([section["max_sustained_rps"] for section in sections]),
            "levels": levels}


def combine_max_sustained(values: Sequence[dict]) -> dict:
    """The trials' `max_sustained_rps`: median, min and max of the rate (None counted as 0, all None stays None),
    each trial's, and the median of the first audible sample's and TTFB's percentiles at the sustained levels."""
    rates = [value["rps"] for value in values]
    numbers = [rate or 0.0 for rate in rates]
    never = all(rate is None for rate in rates)
    combined = {"rps": None if never else statistics.median(numbers), "min": None if never else min(numbers),
                "max": None if never else max(numbers), "per_trial": rates}
    for figure in ("first_audible_s", "ttfb_s"):
        parts = [value[figure] for value in values if value[figure] is not None]
        combined[figure] = combine_leaves(parts, statistics.median) if parts else None
    return combined


def _combine_level(ran: Sequence[tuple[int, dict]]) -> dict:
    levels = [level for _, level in ran]
    summaries = [level["summary"] for level in levels]
    gates = [level["gate"] for level in levels if level.get("gate") is not None]
    sustained = [level["sustained"] for level in levels if level["sustained"] is not None]
    stages = [level["first_packet_stages"] for level in levels if level.get("first_packet_stages")]
    return {"level": levels[0]["level"], "num_trials": len(levels), "trials": [trial for trial, _ in ran],
            "summary": combine_leaves(summaries, statistics.median), "summary_min": combine_leaves(summaries, min),
            "summary_max": combine_leaves(summaries, max),
            "first_packet_stages": combine_leaves(stages, statistics.median) if stages else None,
            "sustained": all(sustained) if sustained else None,
            "gate": combine_gates(gates) if gates else None,
            "requests": [{**request, "trial": trial} for trial, level in ran for request in level["requests"]]}


def combine_gates(gates: Sequence[dict]) -> dict:
    """Passed only if every trial passed; the reasons of any trial; how many passed."""
    reasons = sorted({reason for gate in gates for reason in gate["reasons"]})
    return {"passed": all(gate["passed"] for gate in gates), "reasons": reasons,
            "passed_trials": sum(1 for gate in gates if gate["passed"]), "num_trials": len(gates)}


def combine_leaves(items: Sequence, pick: Pick):
    """`pick` (median, min, max) applied figure by figure across same-shaped dicts: a number is combined with the
    same key's numbers (a key missing from some, like an error code one trial never saw, counts as 0 there); None
    values are left out, and a figure that is None everywhere stays None."""
    if items and all(isinstance(item, dict) for item in items):
        keys = list(dict.fromkeys(key for item in items for key in item))
        return {key: combine_leaves([item.get(key, 0) for item in items], pick) for key in keys}
    numbers = [item for item in items if isinstance(item, int | float) and not isinstance(item, bool)]
    if numbers:
        return pick(numbers)
    return next((item for item in items if item is not None), None)


def _median_or_none(values: Sequence[float | None]) -> float | None:
    numbers = [value for value in values if value is not None]
    return statistics.median(numbers) if numbers else None
