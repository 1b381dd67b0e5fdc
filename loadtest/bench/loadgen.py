"""Load generation: open loop (Poisson arrivals at a fixed rate) and closed loop (a fixed number of clients), the
runner that plays one load level against one gateway and summarizes it, and its progress line on stderr.

Both loops are bounded twice: by a number of requests and by a time limit. A request not started by the time limit
is not sent (counted); one in flight at the limit is cut off by its own deadline (recorded as `client_timeout`).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, TextIO

from loadtest.bench.client import PCM_FORMAT, STREAM_FORMAT_OF, stream_request
from loadtest.bench.metrics import LevelSummary, Slo, StreamRecord, request_metrics, summarize_level
from loadtest.bench.workload import Level, LoadError, Prompt, RequestShape, prompt_for

if TYPE_CHECKING:  # http_speech imports client, as this module does; the runner only holds one
    from loadtest.bench.http_speech import HttpSpeechClient

# send(index, deadline) -> the record of request `index`; `deadline` is a perf_counter() time it must end by.
SendFn = Callable[[int, float], Awaitable[StreamRecord]]
DoneFn = Callable[[StreamRecord], None]
# Below this, a request cut by its level's deadline would not even connect: give it a moment to record why.
_MIN_TIMEOUT_S = 0.05
_BAR_WIDTH = 20
TRANSPORTS = ("websocket", "http")
"""`websocket`: /v1/audio/speech/stream; `http`: POST /v1/audio/speech with raw PCM streamed (http_speech.py), or
another `response_format` decoded as it streams."""


@dataclass(frozen=True, slots=True)
class LevelRun:
    """What a load level produced: the records of the requests sent (by index) and how many were not sent."""

    records: list[StreamRecord]
    num_not_sent: int


def _check(name: str, value: float) -> None:
    if not value > 0:
        raise LoadError(f"{name} must be positive, got {value}")


async def run_open_loop(send: SendFn, *, rate: float, num_requests: int, time_limit_s: float,
                        rng: random.Random, on_done: DoneFn | None = None) -> LevelRun:
    """Start requests at Poisson arrival times (exponential gaps of mean 1/rate, the first at once), whatever
    the mesh's state: the offered load does not slow down when the server does, so queueing shows up as latency."""
    for name, value in (("rate", rate), ("num_requests", num_requests), ("time_limit_s", time_limit_s)):
        _check(name, value)
    start = perf_counter()
    deadline = start + time_limit_s
    tasks: list[asyncio.Task[StreamRecord]] = []
    arrival = start
    async with asyncio.TaskGroup() as group:
        for index in range(num_requests):
            if arrival >= deadline:
                break
            # Waiting for the next scheduled arrival is the load's definition, not a synchronisation.
            await asyncio.sleep(max(0.0, arrival - perf_counter()))
            tasks.append(group.create_task(_send_and_report(send, index, deadline, on_done)))
            arrival += rng.expovariate(rate)
    return LevelRun(records=[task.result() for task in tasks], num_not_sent=num_requests - len(tasks))


async def run_closed_loop(send: SendFn, *, concurrency: int, num_requests: int, time_limit_s: float,
                          on_done: DoneFn | None = None) -> LevelRun:
    """`concurrency` clients, each sending its next request as soon as its previous one ended, until
    `num_requests` have been sent or the time limit has passed."""
    for name, value in (("concurrency", concurrency), ("num_requests", num_requests), ("time_limit_s", time_limit_s)):
        _check(name, value)
    deadline = perf_counter() + time_limit_s
    indices = iter(range(num_requests))  # shared: each client takes the next index
    records: list[StreamRecord] = []

    async def client() -> None:
        for index in indices:
            if perf_counter() >= deadline:
                return
            records.append(await _send_and_report(send, index, deadline, on_done))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, num_requests)):
            group.create_task(client())
    records.sort(key=lambda record: record.index)
    return LevelRun(records=records, num_not_sent=num_requests - len(records))


async def _send_and_report(send: SendFn, index: int, deadline: float, on_done: DoneFn | None) -> StreamRecord:
    record = await send(index, deadline)
    if on_done is not None:
        on_done(record)
    return record


class Progress:
    """Redraws the current level's line as requests end (on a terminal; elsewhere only the final line per level
    is written, so logs stay readable)."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._live = bool(getattr(stream, "isatty", lambda: False)())
        self._prefix = ""
        self._total = 0
        self._done = 0
        self._failed = 0

    def start(self, label: str, level: Level) -> None:
        self._prefix = f"[{label}] {level.name}"
        self._total = level.num_requests
        self._done = self._failed = 0
        self._draw()

    def update(self, record: StreamRecord) -> None:
        self._done += 1
        self._failed += record.error is not None
        self._draw()

    def finish(self, summary: LevelSummary) -> None:
        p95 = summary.first_packet_s.p95
        first_packet = "-" if p95 is None else f"{p95 * 1000:.0f} ms"
        continuous = "-" if summary.continuous_share is None else f"{summary.continuous_share:.0%}"
        line = (f"{self._prefix}: {summary.num_completed}/{summary.num_requests} ok, {summary.num_failed} failed, "
                f"{summary.num_not_sent} not sent | {summary.requests_per_s:.2f} req/s, "
                f"{summary.audio_s_per_s:.2f} audio s/s | p95 first packet {first_packet} | continuous {continuous}"
                f" | goodput {summary.goodput_per_s:.2f}/s")
        self._write(line, final=True)

    def note(self, text: str) -> None:
        self._write(text, final=True)

    def _draw(self) -> None:
        if not self._live:
            return
        filled = _BAR_WIDTH * self._done // max(1, self._total)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self._write(f"{self._prefix} [{bar}] {self._done}/{self._total} failed {self._failed}", final=False)

    def _write(self, text: str, *, final: bool) -> None:
        if self._live:
            self._stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        elif final:
            self._stream.write(text + "\n")
        self._stream.flush()


@dataclass(frozen=True, slots=True)
class Target:
    """A gateway under test: a label for reports, the endpoint's URL and the transport it speaks."""

    label: str
    url: str
    transport: str = "websocket"


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One level at one target: the summary and every request's metrics."""

    target: Target
    level: Level
    summary: LevelSummary
    records: list[StreamRecord]

    def requests_to_dicts(self) -> list[dict]:
        """Every request's metrics, with `started_s`: when it began, in seconds after the level's first request
        began (where in the level it ran: the soak compares the first minute's requests with the last's)."""
        level_start = min((record.started_at for record in self.records), default=0.0)
        rows = []
        for record in self.records:
            metrics = request_metrics(record)
            rows.append({
                "index": metrics.index, "prompt_id": metrics.prompt_id, "request_id": metrics.request_id,
                "started_s": record.started_at - level_start,
                "ok": metrics.ok, "error_code": metrics.error_code,
                "error_message": None if record.error is None else record.error.message,
                "first_packet_s": metrics.first_packet_s, "latency_s": metrics.latency_s,
                "audio_s": metrics.audio_s, "rtf": metrics.rtf, "num_chunks": metrics.num_chunks,
                "chunk_intervals_s": list(metrics.chunk_intervals_s),
                "max_underrun_s": metrics.player.max_underrun_s, "num_gaps": metrics.player.num_gaps,
                "continuous": metrics.is_continuous, **_public_fields(metrics)})
        return rows


def _public_fields(metrics) -> dict:
    """The public method's per-request figures (metrics.py); the underrun fields are None without audible audio."""
    player = metrics.audible_player
    return {"ttfb_s": metrics.ttfb_s, "first_playable_s": metrics.first_playable_s,
            "first_audible_s": metrics.first_audible_s, "audible": player is not None,
            "underrun_events": None if player is None else player.num_underruns,
            "stall_s": None if player is None else player.total_underrun_s,
            "audible_gaps": None if player is None else player.num_gaps}


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
        http: the connection pool of targets whose transport is `http`.
    """

    shape: RequestShape
    sample: list[Prompt]
    slo: Slo
    level_timeout_s: float
    request_timeout_s: float
    api_key: str | None = None
    arrival_seed: int = 0
    http: HttpSpeechClient | None = None

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
        if target.transport == "http" and self.http is None:
            raise LoadError(f"target {target.label} speaks HTTP but the runner has no HTTP client")

        async def send(index: int, deadline: float) -> StreamRecord:
            prompt = prompt_for(self.sample, index)
            timeout = max(_MIN_TIMEOUT_S, min(self.request_timeout_s, deadline - perf_counter()))
            payload = self.shape.payload(prompt.text, index)
            if target.transport == "http":
                return await self.http.request(target.url, payload, index=index, prompt_id=prompt.id,
                                               timeout_s=timeout, response_format=self.shape.response_format)
            stream_format = STREAM_FORMAT_OF[self.shape.response_format]
            if stream_format != PCM_FORMAT:  # the socket's default is left out, as before formats could be asked
                payload["format"] = stream_format
            return await stream_request(target.url, payload, index=index, prompt_id=prompt.id, timeout_s=timeout,
                                        api_key=self.api_key)

        return send
