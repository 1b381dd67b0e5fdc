"""`voxmesh bench`: sweep load levels against one gateway, or two alternately, and write the JSON document.

In comparison mode the two targets (two mesh configurations or topologies) take turns level by level, and the
order flips every level (A B, B A, A B...) so that neither always runs on a machine warmed, or worn, by the other.

A sweep (`sweep=True`, open levels only, one target) runs the rates in ascending order and stops after the first
level that fails the public method's gate (gate.py): the rates above it are listed as not run.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.bench.audible import AUDIBLE_DBFS, AUDIBLE_THRESHOLD, RANDOM_WEIGHTS_NOTE
from loadtest.bench.client import redacted
from loadtest.bench.gate import Gate, SweepStop
from loadtest.bench.http_speech import HttpSpeechClient, streamed_fields
from loadtest.bench.loadgen import LevelResult, LevelRunner, Progress, Target
from loadtest.bench.metrics import GAP_THRESHOLD_S, Slo
from loadtest.bench.stage_reader import StageReader
from loadtest.bench.report import SCHEMA, comparison_section, meta, target_section
from loadtest.bench.workload import DEFAULT_PROMPTS, Level, RequestShape, fixed_sample, load_prompts


class BenchError(RuntimeError):
    """The bench cannot produce meaningful figures (bad targets, or a warm-up request failed).

    Attributes:
        code: `invalid_targets` or `warmup_failed`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """A whole bench run.

    Attributes:
        targets: one gateway, or two (baseline first, then candidate) for a comparison.
        levels: the load levels, in the order they run.
        shape: request fields besides the text (voice, length mode...).
        slo: the goodput SLO.
        p95_first_packet_bound_s: an open level is "sustained" only with p95 first packet within this.
        prompts_path: the `id<TAB>text` file.
        level_timeout_s, request_timeout_s: time bounds.
        warmup: unmeasured requests per target before the first level.
        api_key: bearer token for gateways that require one.
        arrival_seed: seed of the Poisson arrival times.
        events_urls: for each target, its mesh's NATS URL (or None): where the stage breakdown of first packets
            is read from (stages.py).
        gate: the public method's hard gate per open level.
        sweep: stop at the first open level that fails the gate.
    """

    targets: tuple[Target, ...]
    levels: tuple[Level, ...]
    shape: RequestShape = field(default_factory=RequestShape)
    slo: Slo = field(default_factory=Slo)
    p95_first_packet_bound_s: float = 0.5
    prompts_path: Path = DEFAULT_PROMPTS
    level_timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    warmup: int = 1
    api_key: str | None = None
    arrival_seed: int = 0
    events_urls: tuple[str | None, ...] = ()
    gate: Gate = field(default_factory=Gate)
    sweep: bool = False

    def __post_init__(self) -> None:
        labels = [target.label for target in self.targets]
        if not 1 <= len(self.targets) <= 2:
            raise BenchError("invalid_targets", f"give one gateway, or two to compare; got {len(self.targets)}")
        if len(set(labels)) != len(labels):
            raise BenchError("invalid_targets", f"the two targets need different labels, both are {labels[0]!r}")
        if len(self.events_urls) > len(self.targets):
            raise BenchError("invalid_targets", f"{len(self.events_urls)} events URLs for {len(self.targets)} targets")
        if self.sweep and (len(self.targets) > 1 or any(level.mode != "open" for level in self.levels)):
            raise BenchError("invalid_targets", "a sweep runs open-loop levels against one gateway (no "
                                                "--compare-url, --mode open)")

    def to_dict(self) -> dict:
        return {"levels": [level.to_dict() for level in self.levels], "request": self.shape.to_dict(),
                "slo": self.slo.to_dict(), "p95_first_packet_bound_s": self.p95_first_packet_bound_s,
                "prompts_path": str(self.prompts_path), "level_timeout_s": self.level_timeout_s,
                "request_timeout_s": self.request_timeout_s, "warmup": self.warmup,
                "arrival_seed": self.arrival_seed, "targets": [target.label for target in self.targets],
                "events_urls": [None if url is None else redacted(url) for url in self.events_urls],
                "gate": self.gate.to_dict(), "sweep": self.sweep}


async def run_bench(config: BenchConfig, *, command: str, progress: Progress | None = None) -> dict:
    """Run every level at every target and return the JSON document."""
    sample = fixed_sample(load_prompts(config.prompts_path))
    async with contextlib.AsyncExitStack() as stack:
        http = None
        if any(target.transport == "http" for target in config.targets):
            http = await stack.enter_async_context(HttpSpeechClient(config.api_key))
        runner = LevelRunner(shape=config.shape, sample=sample, slo=config.slo,
                             level_timeout_s=config.level_timeout_s, request_timeout_s=config.request_timeout_s,
                             api_key=config.api_key, arrival_seed=config.arrival_seed, http=http)
        readers = {target.label: await stack.enter_async_context(StageReader.open(url))
                   for target, url in zip(config.targets, config.events_urls) if url is not None}
        warmups = {target.label: await _warm_up(runner, target, config.warmup) for target in config.targets}
        results, stops = await _run_levels(config, runner, progress)
        stages = {label: await reader.stages(results[label]) for label, reader in readers.items()}
    document = _document(config, command, results, warmups, num_prompts=len(sample), stages=stages)
    if config.sweep:
        document["sweep"] = _sweep_section(config, results, stops)
    return document


async def _run_levels(config: BenchConfig, runner: LevelRunner,
                      progress: Progress | None) -> tuple[dict[str, list[LevelResult]], dict[str, SweepStop]]:
    results: dict[str, list[LevelResult]] = {target.label: [] for target in config.targets}
    stops = {target.label: SweepStop() for target in config.targets}
    for number, level in enumerate(config.levels):
        order = config.targets if number % 2 == 0 else tuple(reversed(config.targets))
        for target in order:
            if config.sweep and not stops[target.label].should_run():
                continue
            result = await runner.run(target, level, progress)
            results[target.label].append(result)
            if level.mode == "open":
                stops[target.label].record(level.load, config.gate.verdict(result.summary))
    return results, stops


def _sweep_section(config: BenchConfig, results: dict[str, list[LevelResult]], stops: dict[str, SweepStop]) -> dict:
    (label, stop), = stops.items()
    ran = {result.level.load for result in results[label]}
    return {"stopped_at_rps": stop.stopped_at,
            "not_run_rps": [level.load for level in config.levels if level.load not in ran]}


def public_method(config: BenchConfig) -> dict:
    """How the public open-loop method's figures were taken: every figure of the document is labelled by this."""
    return {"transports": {target.label: target.transport for target in config.targets},
            "http_fields": streamed_fields(config.shape.response_format),
            "response_format": config.shape.response_format, "sample_rate": config.shape.sample_rate,
            "length_mode": config.shape.length_mode,
            "length": config.shape.describe_length(), "audible_threshold_dbfs": AUDIBLE_DBFS,
            "audible_threshold_s16": AUDIBLE_THRESHOLD, "audible_note": RANDOM_WEIGHTS_NOTE,
            "underrun_rule": "an event each time the player, its clock started at the first audible sample, finds "
                             "its buffer empty before the stream ended; stall = the waits added up",
            "gap_rule_s": GAP_THRESHOLD_S, "gate": config.gate.to_dict()}


async def _warm_up(runner: LevelRunner, target: Target, count: int) -> dict:
    records = await runner.warm_up(target, count)
    failed = [record for record in records if record.error is not None]
    if failed:
        error = failed[0].error
        raise BenchError("warmup_failed", f"a warm-up request to {target.label} ({target.url}) failed, so every "
                                          f"measured one would too: {error.code}: {error.message}")
    return {"num_requests": count}


def _document(config: BenchConfig, command: str, results: dict[str, list[LevelResult]], warmups: dict,
              num_prompts: int, stages: dict[str, list[dict | None]]) -> dict:
    bound = config.p95_first_packet_bound_s
    targets = [target_section(target, results[target.label], bound, warmups[target.label], stages.get(target.label),
                              gate=config.gate, length_mode=config.shape.length_mode,
                              response_format=config.shape.response_format, sample_rate=config.shape.sample_rate)
               for target in config.targets]
    comparison = None
    if len(config.targets) == 2:
        baseline, candidate = config.targets
        comparison = comparison_section(baseline, candidate, results[baseline.label], results[candidate.label], bound)
    return {"schema": SCHEMA, "meta": meta(command), "length_mode": config.shape.length_mode,
            "length": config.shape.describe_length(), "config": {**config.to_dict(), "num_prompts": num_prompts},
            "public_method": public_method(config), "targets": targets, "comparison": comparison}


def write_json(document: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
