"""Where each first packet's time went, stage by stage, from the lifecycle events the mesh stores on EVENTS.

Every service stamps its events with the host's wall clock (`at`, unix time): the gateway's Accepted, decode's
Started and FirstFrame, the vocoder's FirstAudio. A client on the same host knows when it began a request and when its
first audio arrived. Between them lie six stages whose durations add up to the client's first packet exactly:

- connect: the client begins -> its request is sent (the WebSocket handshake);
- submit: sent -> the gateway has put the request on REQUESTS (validation, the queue's acknowledgement);
- queue: Accepted -> decode has claimed the request and announced it (the wait on REQUESTS, the claim, the marker);
- first_frame: Started -> the request's first frame reached decode's event loop (the prompt built, admission into
  the engine, the prefill step and every step before it);
- first_audio: FirstFrame -> the vocoder handed the first chunk's audio to the bus (the rest of the first chunk's
  frames, its append to CODES, the codec's queue and call);
- delivery: FirstAudio -> the client has the audio (the gateway's relay and the WebSocket).

The events are read after the run, from the stream (nothing in the measured path changes), so the mesh's NATS must be
reachable from the bench (`--events-url`), and the bench must run on the mesh's host: the stages compare the clocks of
different processes, which only one host's clock makes comparable.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nats.js.api import ConsumerConfig, DeliverPolicy

from loadtest.bench.metrics import StreamRecord, summarize
from messages import LifecycleEvent, decode, subjects
from messages.errors import DecodeError
from messages.events import Accepted, FirstAudio, FirstFrame, Started
from messages.streams import EVENTS_STREAM

STAGES = ("connect", "submit", "queue", "first_frame", "first_audio", "delivery")
"""In order; each ends where the next begins."""

_MARKS = {Accepted: "accepted", Started: "started", FirstFrame: "first_frame", FirstAudio: "first_audio"}
"""The events that bound a stage, by the name the stages use for the moment each stands for."""

READ_TIMEOUT_S = 10.0
"""The longest wait for the next stored event while reading back (the server sends them at once)."""


@dataclass(frozen=True, slots=True)
class EventsMark:
    """Where EVENTS stood before a run: the run's events are the ones stored after `last_sequence`."""

    last_sequence: int


async def events_mark(js) -> EventsMark:
    """EVENTS' last stored sequence now (read before the first request)."""
    info = await js.stream_info(EVENTS_STREAM)
    return EventsMark(last_sequence=info.state.last_seq)


async def read_marks(js, since: EventsMark, request_ids: Iterable[str]) -> dict[str, dict[str, float]]:
    """For each of `request_ids`, the unix time of its first Accepted, Started, FirstFrame and FirstAudio stored
    after `since` (a request retried or migrated keeps its first of each). Requests without events are absent."""
    wanted = set(request_ids)
    last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
    marks: dict[str, dict[str, float]] = {}
    if last <= since.last_sequence or not wanted:
        return marks
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=since.last_sequence + 1)
    sub = await js.subscribe(subjects.all_events(), stream=EVENTS_STREAM, ordered_consumer=True, config=config)
    try:
        while True:
            msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
            _take(marks, wanted, msg.data)
            if msg.metadata.sequence.stream >= last:
                return marks
    finally:
        await sub.unsubscribe()


def _take(marks: dict[str, dict[str, float]], wanted: set[str], data: bytes) -> None:
    try:
        event = decode(data, LifecycleEvent)
    except DecodeError:  # another version's event: it marks nothing here
        return
    name = _MARKS.get(type(event))
    if name is not None and event.request_id in wanted:
        marks.setdefault(event.request_id, {}).setdefault(name, event.at)


def stage_seconds(record: StreamRecord, marks: dict[str, float], unix_offset: float) -> dict[str, float] | None:
    """The six stages of one request's first packet, in seconds; None when the request has no audio or an event is
    missing (a request refused before decode, a hand-off from a prefill replica: no Started). `unix_offset` turns
    the client's `perf_counter` times into unix time (`unix_offset()`)."""
    audio = [chunk.at for chunk in record.chunks if chunk.num_samples > 0]
    if record.sent_at is None or not audio or any(name not in marks for name in _MARKS.values()):
        return None
    moments = [record.started_at + unix_offset, record.sent_at + unix_offset, marks["accepted"], marks["started"],
               marks["first_frame"], marks["first_audio"], audio[0] + unix_offset]
    return {stage: later - earlier for stage, earlier, later in zip(STAGES, moments, moments[1:])}


def unix_offset() -> float:
    """What to add to a `time.perf_counter()` reading of this process to get unix time."""
    return time.time() - time.perf_counter()


def level_stages(records: Sequence[StreamRecord], marks: dict[str, dict[str, float]], offset: float) -> dict | None:
    """A level's first packets by stage: each stage's distribution (seconds, `Summary` fields) over the requests
    whose stages are all known, how many those were, and each one's stages by request id; None when none was."""
    known = {record.request_id: stages for record in records if record.request_id in marks
             for stages in [stage_seconds(record, marks[record.request_id], offset)] if stages is not None}
    if not known:
        return None
    return {"num_requests": len(known),
            **{stage: summarize([stages[stage] for stages in known.values()]).to_dict() for stage in STAGES},
            "by_request": known}
