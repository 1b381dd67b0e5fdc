"""Per-request metrics of one streamed synthesis, from the arrival times of its audio chunks.

The definitions are the ones every report of this project uses:
- first packet: from the start of the request to the arrival of the first non-empty audio chunk;
- end-to-end latency: from the start of the request to its final event (`audio.done`, or `error`);
- RTF (real-time factor): end-to-end latency / seconds of audio received (below 1 is faster than real time);
- chunk intervals: the times between consecutive non-empty chunk arrivals;
- underrun: a simulated player starts playing at the first chunk's arrival and plays in real time; whenever its
  buffer runs dry before the next chunk arrives, it waits: that wait is an underrun;
- playback gap: an underrun longer than 10 ms; a continuous stream has none. The largest underrun is reported too,
  so that other gap definitions can be compared from the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GAP_THRESHOLD_S = 0.010
# Arrival times are floats: a scripted 10 ms stall may compute as 10.000000000002 ms. Differences below this are
# rounding, not waiting, so they neither count as underruns nor push an underrun over the gap threshold.
ROUNDING_S = 1e-9


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
    """

    code: str
    message: str
    stage: str | None = None


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
        player: the simulated player's experience.
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
        chunk_intervals_s=intervals, player=simulate_player(arrivals))
