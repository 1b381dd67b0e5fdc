"""The figures of a load test: per request (from the arrival times of its audio chunks), as distributions, and
per load level (throughput, latency, continuity and goodput under an SLO).

The definitions are the ones every report of this project uses:
- first packet: from the start of the request to the arrival of the first non-empty audio chunk;
- end-to-end latency: from the start of the request to its final event (`audio.done`, or `error`);
- RTF (real-time factor): end-to-end latency / seconds of audio received (below 1 is faster than real time);
- chunk intervals: the times between consecutive non-empty chunk arrivals;
- underrun: a simulated player starts playing at the first chunk's arrival and plays in real time; whenever its
  buffer runs dry before the next chunk arrives, it waits: that wait is an underrun;
- playback gap: an underrun longer than 10 ms; a continuous stream has none. The largest underrun is reported too,
  so that other gap definitions can be compared from the same data.

The public open-loop method adds, per request:
- time to first byte (TTFB): from the start to the first byte of the response body (HTTP) or of the first audio frame
  (WebSocket); first playable sample: to the first whole sample (the first packet above);
- first audible sample: to the arrival of the first sample above AUDIBLE_DBFS (audible.py);
- underrun events and total stall: a player whose clock starts at the first audible sample plays in real time from
  it; every time its buffer empties at all before the stream has ended is one event, and the waits add up to the
  stall. The 10 ms gap rule is applied to the same waits and reported beside.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from loadtest.bench.audible import AudibleSample

GAP_THRESHOLD_S = 0.010
# Arrival times are floats: a scripted 10 ms stall may compute as 10.000000000002 ms. Differences below this are
# rounding, not waiting, so they neither count as underruns nor push an underrun over the gap threshold.
ROUNDING_S = 1e-9
PERCENTILES = (50, 90, 95, 99)
OVERLOAD_CODES = frozenset({"queue_full", "too_many_requests"})
"""The gateway's codes for load it refused; over HTTP they come with status 429."""


@dataclass(frozen=True, slots=True)
class ChunkArrival:
    """One binary audio frame as the client received it.

    Attributes:
        at: `time.perf_counter()` when the frame had arrived.
        num_samples: samples in the frame (0 for an empty frame).
    """

    at: float
    num_samples: int


@dataclass(frozen=True, slots=True)
class StreamError:
    """Why a request did not complete.

    Attributes:
        code: machine-readable: the gateway's error code (`queue_full`, `timeout`, ...) or a client-side one
            (`connect_failed`, `client_timeout`, `protocol_error`, `incomplete_audio`, `connection_closed`).
        message: for a person.
        stage: the mesh stage that failed, when the gateway named one.
        http_status: the HTTP status of a refused HTTP request (None over the WebSocket, or once audio had begun).
    """

    code: str
    message: str
    stage: str | None = None
    http_status: int | None = None

    @property
    def is_overload(self) -> bool:
        """A refusal for load: HTTP 429, or the codes the gateway answers 429 with (the same refusal on a socket)."""
        return self.http_status == 429 or self.code in OVERLOAD_CODES


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """The raw timeline of one request, as measured by a client (all times from `time.perf_counter()`).

    Attributes:
        index: the request's position in its load level.
        prompt_id: the prompt's id from the prompts file.
        started_at: when the client began (before connecting: the connection is part of what a user waits for).
        sent_at: when the request message had been sent (None if it never was).
        ended_at: when the final event arrived, or the client gave up.
        chunks: every binary audio frame, in arrival order.
        sample_rate: samples per second of the PCM.
        request_id: the id the gateway assigned (None if it never said).
        error: None when the request completed with `audio.done` and every sample it announced.
        first_byte_at: when the first byte of audio arrived (None if none did).
        first_audible: where and when the first audible sample arrived (None if none did).
    """

    index: int
    prompt_id: str
    started_at: float
    sent_at: float | None
    ended_at: float
    chunks: tuple[ChunkArrival, ...]
    sample_rate: int
    request_id: str | None = None
    error: StreamError | None = None
    first_byte_at: float | None = None
    first_audible: AudibleSample | None = None


@dataclass(frozen=True, slots=True)
class PlayerResult:
    """What a real-time player starting at the first chunk experienced.

    Attributes:
        underruns_s: every wait of the player for data, in order (each > 0).
        max_underrun_s: the longest wait (0.0 when it never waited).
        total_underrun_s: all waits added up.
        num_gaps: waits longer than GAP_THRESHOLD_S.
    """

    underruns_s: tuple[float, ...]
    max_underrun_s: float
    total_underrun_s: float
    num_gaps: int

    @property
    def is_continuous(self) -> bool:
        return self.num_gaps == 0

    @property
    def num_underruns(self) -> int:
        """Times the buffer emptied at all (the public method's underrun events)."""
        return len(self.underruns_s)


def simulate_player(arrivals: Sequence[tuple[float, float]]) -> PlayerResult:
    """Play chunks `(arrival time, duration in seconds)` in real time from the first arrival.

    The buffer runs dry at `play_end`; a chunk arriving after that makes the player wait `arrival - play_end`, and
    playback resumes at the arrival. Chunks must be in arrival order.
    """
    underruns: list[float] = []
    play_end: float | None = None
    for at, duration in arrivals:
        if play_end is None:
            play_end = at + duration
            continue
        wait = at - play_end
        if wait > ROUNDING_S:
            underruns.append(wait)
            play_end = at + duration
        else:
            play_end += duration
    gaps = sum(1 for wait in underruns if wait > GAP_THRESHOLD_S + ROUNDING_S)
    return PlayerResult(underruns_s=tuple(underruns), max_underrun_s=max(underruns, default=0.0),
                        total_underrun_s=sum(underruns), num_gaps=gaps)


def arrivals_from(chunks: Sequence[ChunkArrival], first_index: int, sample_rate: int) -> list[tuple[float, float]]:
    """`(arrival time, seconds)` of the audio from sample `first_index` on: the chunk holding that sample counts
    only its part from there (what a player whose clock starts at that sample has to play)."""
    arrivals = []
    position = 0
    for chunk in chunks:
        end = position + chunk.num_samples
        if chunk.num_samples > 0 and end > first_index:
            arrivals.append((chunk.at, (end - max(position, first_index)) / sample_rate))
        position = end
    return arrivals


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """The per-request figures (seconds throughout).

    Attributes:
        index, prompt_id, request_id: which request.
        ok: completed with every announced sample.
        error_code: the StreamError's code when not ok.
        first_packet_s: start -> first non-empty chunk (None if none arrived).
        latency_s: start -> final event (or giving up).
        audio_s: seconds of audio received.
        rtf: latency_s / audio_s (None without audio).
        num_chunks: non-empty chunks received.
        chunk_intervals_s: gaps between consecutive non-empty chunk arrivals.
        player: the simulated player's experience (its clock started at the first chunk).
        ttfb_s: start -> first byte of audio (None if none arrived).
        first_audible_s: start -> first audible sample (None if none arrived).
        audible_player: the public method's player, its clock started at the first audible sample (None without one).
    """

    index: int
    prompt_id: str
    request_id: str | None
    ok: bool
    error_code: str | None
    first_packet_s: float | None
    latency_s: float
    audio_s: float
    rtf: float | None
    num_chunks: int
    chunk_intervals_s: tuple[float, ...]
    player: PlayerResult
    ttfb_s: float | None = None
    first_audible_s: float | None = None
    audible_player: PlayerResult | None = None

    @property
    def first_playable_s(self) -> float | None:
        """The first whole sample's arrival: the first packet."""
        return self.first_packet_s

    @property
    def is_continuous(self) -> bool:
        """A completed stream the player never had to wait on for more than GAP_THRESHOLD_S."""
        return self.ok and self.player.is_continuous


def request_metrics(record: StreamRecord) -> RequestMetrics:
    """Compute a request's metrics from its timeline."""
    audio = [chunk for chunk in record.chunks if chunk.num_samples > 0]
    arrivals = [(chunk.at, chunk.num_samples / record.sample_rate) for chunk in audio]
    audio_s = sum(duration for _, duration in arrivals)
    latency_s = record.ended_at - record.started_at
    intervals = tuple(later.at - earlier.at for earlier, later in zip(audio, audio[1:]))
    return RequestMetrics(
        index=record.index, prompt_id=record.prompt_id, request_id=record.request_id, ok=record.error is None,
        error_code=None if record.error is None else record.error.code,
        first_packet_s=audio[0].at - record.started_at if audio else None, latency_s=latency_s,
        audio_s=audio_s, rtf=latency_s / audio_s if audio_s > 0 else None, num_chunks=len(audio),
        chunk_intervals_s=intervals, player=simulate_player(arrivals),
        ttfb_s=_since(record.first_byte_at, record.started_at),
        first_audible_s=None if record.first_audible is None else record.first_audible.at - record.started_at,
        audible_player=None if record.first_audible is None else simulate_player(
            arrivals_from(audio, record.first_audible.index, record.sample_rate)))


def _since(moment: float | None, start: float) -> float | None:
    return None if moment is None else moment - start



@dataclass(frozen=True, slots=True)
class Summary:
    """A distribution in a few numbers (None for each when there were no values).

    Percentiles interpolate linearly between the two nearest ranks (numpy's default, as most published serving
    benchmarks use), so p95 of few values is not simply the largest one.
    """

    count: int
    mean: float | None
    median: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    min: float | None
    max: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Summarize `values` (any order)."""
    if not values:
        return Summary(count=0, mean=None, median=None, p90=None, p95=None, p99=None, min=None, max=None)
    array = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = (float(value) for value in np.percentile(array, PERCENTILES))
    return Summary(count=int(array.size), mean=float(array.mean()), median=p50, p90=p90, p95=p95, p99=p99,
                   min=float(array.min()), max=float(array.max()))



class SloError(ValueError):
    """An SLO that cannot be met by construction (non-positive first-packet bound)."""

    code = "invalid_slo"


@dataclass(frozen=True, slots=True)
class Slo:
    """The service level a request must meet to count towards goodput.

    Attributes:
        first_packet_s: the first packet must arrive within this many seconds.
        require_continuous: the stream must play without a gap (an underrun over 10 ms).
    """

    first_packet_s: float = 0.5
    require_continuous: bool = True

    def __post_init__(self) -> None:
        if not self.first_packet_s > 0:
            raise SloError(f"the SLO's first-packet bound must be positive, got {self.first_packet_s} s")

    def is_met_by(self, metrics: RequestMetrics) -> bool:
        if not metrics.ok or metrics.first_packet_s is None or metrics.first_packet_s > self.first_packet_s:
            return False
        return metrics.is_continuous or not self.require_continuous

    def to_dict(self) -> dict:
        return {"first_packet_s": self.first_packet_s, "require_continuous": self.require_continuous}


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """One load level's figures. Rates divide by `wall_s`, from the first request's start to the last one's end.

    Distributions (first packet, latency, RTF, max underrun) cover completed requests; chunk intervals pool every
    interval of every completed request. `continuous_share` is over completed requests; goodput counts requests
    that completed within the SLO, so a failed request lowers goodput but not continuity.

    The public method's figures: TTFB, first playable and first audible sample (distributions over completed
    requests), completed requests with no audible sample, the audible-clock player's underrun events, total stall
    and 10 ms gaps summed over completed requests, and the requests refused for load (HTTP 429 or its codes).
    """

    num_requests: int
    num_completed: int
    num_failed: int
    num_not_sent: int
    errors: dict[str, int]
    wall_s: float
    requests_per_s: float
    audio_s: float
    audio_s_per_s: float
    first_packet_s: Summary
    latency_s: Summary
    rtf: Summary
    chunk_interval_s: Summary
    max_underrun_s: Summary
    num_gaps: int
    continuous_share: float | None
    goodput_count: int
    goodput_share: float | None
    goodput_per_s: float
    ttfb_s: Summary
    first_playable_s: Summary
    first_audible_s: Summary
    num_inaudible: int
    num_underrun_events: int
    num_streams_with_underruns: int
    total_stall_s: float
    num_audible_gaps: int
    num_overloaded: int

    def to_dict(self) -> dict:
        fields = {name: getattr(self, name) for name in self.__slots__}
        return {name: value.to_dict() if isinstance(value, Summary) else value for name, value in fields.items()}


def summarize_level(records: Sequence[StreamRecord], slo: Slo, num_not_sent: int = 0) -> LevelSummary:
    """Summarize the requests of one level; `num_not_sent` counts requests the level's time bound cut off."""
    metrics = [request_metrics(record) for record in records]
    done = [m for m in metrics if m.ok]
    wall_s = _wall_s(records)
    audio_s = sum(m.audio_s for m in done)
    goodput = sum(1 for m in metrics if slo.is_met_by(m))
    issued = len(records) + num_not_sent
    return LevelSummary(
        num_requests=issued, num_completed=len(done), num_failed=len(metrics) - len(done), num_not_sent=num_not_sent,
        errors=dict(Counter(m.error_code for m in metrics if m.error_code is not None)), wall_s=wall_s,
        requests_per_s=_rate(len(done), wall_s), audio_s=audio_s, audio_s_per_s=_rate(audio_s, wall_s),
        first_packet_s=summarize([m.first_packet_s for m in done if m.first_packet_s is not None]),
        latency_s=summarize([m.latency_s for m in done]),
        rtf=summarize([m.rtf for m in done if m.rtf is not None]),
        chunk_interval_s=summarize([interval for m in done for interval in m.chunk_intervals_s]),
        max_underrun_s=summarize([m.player.max_underrun_s for m in done]),
        num_gaps=sum(m.player.num_gaps for m in done),
        continuous_share=sum(1 for m in done if m.is_continuous) / len(done) if done else None,
        goodput_count=goodput, goodput_share=goodput / issued if issued else None,
        goodput_per_s=_rate(goodput, wall_s), **_public_figures(metrics, records))


def _public_figures(metrics: Sequence[RequestMetrics], records: Sequence[StreamRecord]) -> dict:
    """The public open-loop method's figures of one level (LevelSummary's fields from `ttfb_s` on)."""
    done = [m for m in metrics if m.ok]
    players = [m.audible_player for m in done if m.audible_player is not None]
    return {"ttfb_s": summarize([m.ttfb_s for m in done if m.ttfb_s is not None]),
            "first_playable_s": summarize([m.first_playable_s for m in done if m.first_playable_s is not None]),
            "first_audible_s": summarize([m.first_audible_s for m in done if m.first_audible_s is not None]),
            "num_inaudible": sum(1 for m in done if m.audible_player is None),
            "num_underrun_events": sum(player.num_underruns for player in players),
            "num_streams_with_underruns": sum(1 for player in players if player.num_underruns),
            "total_stall_s": sum(player.total_underrun_s for player in players),
            "num_audible_gaps": sum(player.num_gaps for player in players),
            "num_overloaded": sum(1 for record in records if record.error is not None and record.error.is_overload)}


def _wall_s(records: Sequence[StreamRecord]) -> float:
    if not records:
        return 0.0
    return max(record.ended_at for record in records) - min(record.started_at for record in records)


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0
