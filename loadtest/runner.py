"""Runs one load level against one gateway and summarizes it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from time import perf_counter

from loadtest.aggregate import LevelSummary, Slo, summarize_level
from loadtest.client import stream_request
from loadtest.levels import Level
from loadtest.loadgen import run_closed_loop, run_open_loop
from loadtest.metrics import StreamRecord, request_metrics
from loadtest.payload import RequestShape
from loadtest.progress import Progress
from loadtest.prompts import Prompt, prompt_for

# Below this, a request cut by its level's deadline would not even connect: give it a moment to record why.
_MIN_TIMEOUT_S = 0.05


@dataclass(frozen=True, slots=True)
class Target:
    """A gateway under test: a label for reports and its WebSocket stream URL."""

    label: str
    url: str


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One level at one target: the summary and every request's metrics."""

    target: Target
    level: Level
    summary: LevelSummary
    records: list[StreamRecord]

    def requests_to_dicts(self) -> list[dict]:
        rows = []
        for record in self.records:
            metrics = request_metrics(record)
            rows.append({
                "index": metrics.index, "prompt_id": metrics.prompt_id, "request_id": metrics.request_id,
                "ok": metrics.ok, "error_code": metrics.error_code,
                "error_message": None if record.error is None else record.error.message,
                "first_packet_s": metrics.first_packet_s, "latency_s": metrics.latency_s,
                "audio_s": metrics.audio_s, "rtf": metrics.rtf, "num_chunks": metrics.num_chunks,
                "chunk_intervals_s": list(metrics.chunk_intervals_s),
                "max_underrun_s": metrics.player.max_underrun_s, "num_gaps": metrics.player.num_gaps,
                "continuous": metrics.is_continuous})
        return rows


@dataclass(frozen=True, slots=True)
class LevelRunner:
    """Sends the prompts of a fixed sample with one request shape, under a time bound per level.

    Attributes:
        shape: the request fields besides the text.
        sample: prompts in the bench's fixed order.
        slo: the goodput SLO.
        level_timeout_s: the most one level may last.
        request_timeout_s: the most one request may last.
        api_key: sent as a bearer token when set.
        arrival_seed: seeds the Poisson arrivals (each level gets its own stream of the same seed).
    """

    shape: RequestShape
    sample: list[Prompt]
    slo: Slo
    level_timeout_s: float
    request_timeout_s: float
    api_key: str | None = None
    arrival_seed: int = 0

    async def run(self, target: Target, level: Level, progress: Progress | None = None) -> LevelResult:
        """Run `level` against `target`."""
        if progress is not None:
            progress.start(target.label, level)
        on_done = progress.update if progress is not None else None
        send = self._sender(target)
        if level.mode == "open":
            run = await run_open_loop(send, rate=level.load, num_requests=level.num_requests,
                                      time_limit_s=self.level_timeout_s, rng=random.Random(self.arrival_seed),
                                      on_done=on_done)
        else:
            run = await run_closed_loop(send, concurrency=int(level.load), num_requests=level.num_requests,
                                        time_limit_s=self.level_timeout_s, on_done=on_done)
        summary = summarize_level(run.records, self.slo, num_not_sent=run.num_not_sent)
        if progress is not None:
            progress.finish(summary)
        return LevelResult(target=target, level=level, summary=summary, records=run.records)

    async def warm_up(self, target: Target, count: int) -> list[StreamRecord]:
        """Send `count` requests one after another (not measured): first-request costs stay out of the figures."""
        send = self._sender(target)
        return [await send(index, perf_counter() + self.request_timeout_s) for index in range(count)]

    def _sender(self, target: Target):
        async def send(index: int, deadline: float) -> StreamRecord:
            prompt = prompt_for(self.sample, index)
            timeout = max(_MIN_TIMEOUT_S, min(self.request_timeout_s, deadline - perf_counter()))
            return await stream_request(target.url, self.shape.payload(prompt.text, index), index=index,
                                        prompt_id=prompt.id, timeout_s=timeout, api_key=self.api_key)

        return send
