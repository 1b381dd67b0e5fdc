"""Lifecycle events on `tts.events.<id>.<kind>` (stream EVENTS), and the one terminal event per request."""

from __future__ import annotations

from typing import ClassVar, Literal

from messages import subjects
from messages.base import Message, NonNegInt, ReplicaName, RequestId, Seconds, Seed, UnixTime, Usage
from messages.errors import ErrorCode, Stage
from messages.requests import TenantName


class Event(Message, kw_only=True, frozen=True):
    """Base of lifecycle events. KIND is the last subject token.

    Attributes:
        request_id: the request.
        at: unix time the event happened.
    """

    KIND: ClassVar[str] = ""

    request_id: RequestId
    at: UnixTime


class Accepted(Event, tag="accepted", kw_only=True, frozen=True):
    """The gateway admitted the request onto REQUESTS.

    Attributes:
        model: model name.
        seed: the seed fixed at admission.
        text_chars: characters of input text.
        tenant: the request's tenant (the name of its API key; "" for the anonymous tenant), for usage.
    """

    KIND: ClassVar[str] = "accepted"
    model: str
    seed: Seed
    text_chars: NonNegInt
    tenant: TenantName = ""  # appended last: older readers skip it


class Started(Event, tag="started", kw_only=True, frozen=True):
    """A decode replica claimed the request (owner epoch) and began its prefill.

    Attributes:
        replica: the decode replica.
        epoch: the ownership epoch it claimed.
        queued_s: seconds the request waited on REQUESTS.
    """

    KIND: ClassVar[str] = "started"
    replica: ReplicaName
    epoch: NonNegInt
    queued_s: Seconds = 0.0


class FirstFrame(Event, tag="first_frame", kw_only=True, frozen=True):
    """Decode emitted the request's first codec frame.

    Attributes:
        replica: the decode replica.
    """

    KIND: ClassVar[str] = "first_frame"
    replica: ReplicaName


class FirstAudio(Event, tag="first_audio", kw_only=True, frozen=True):
    """The vocoder published the request's first PCM chunk.

    Attributes:
        replica: the vocoder replica.
    """

    KIND: ClassVar[str] = "first_audio"
    replica: ReplicaName


class Preempted(Event, tag="preempted", kw_only=True, frozen=True):
    """The scheduler took the request's KV blocks (recompute preemption or an operator drain).

    Attributes:
        replica: the decode replica.
        frames_done: frames emitted before preemption.
        cause: "capacity" (KV pool full) or "drain" (operator).
    """

    KIND: ClassVar[str] = "preempted"
    replica: ReplicaName
    frames_done: NonNegInt
    cause: Literal["capacity", "drain"] = "capacity"


class Resumed(Event, tag="resumed", kw_only=True, frozen=True):
    """A preempted request was replayed (prompt + emitted frames) and continues.

    Attributes:
        replica: the decode replica.
        frames_done: frames it continues from.
    """

    KIND: ClassVar[str] = "resumed"
    replica: ReplicaName
    frames_done: NonNegInt


class Migrated(Event, tag="migrated", kw_only=True, frozen=True):
    """Another decode replica took the request over after its owner's lease lapsed.

    Attributes:
        from_replica: the previous owner.
        to_replica: the new owner.
        epoch: the new ownership epoch.
        frames_done: frames it continues from.
    """

    KIND: ClassVar[str] = "migrated"
    from_replica: ReplicaName
    to_replica: ReplicaName
    epoch: NonNegInt
    frames_done: NonNegInt


class Finished(Event, tag="finished", kw_only=True, frozen=True):
    """Terminal: all audio was published.

    Attributes:
        frames: codec frames generated.
        audio_seconds: seconds of audio published.
        chunk_count: audio chunks published (seq 0..chunk_count-1); the gateway completes once it has them all.
        stop: "eos" or "length" (max_new_tokens or the runaway guard).
        usage: what the request consumed.
    """

    KIND: ClassVar[str] = subjects.TERMINAL_KIND
    frames: NonNegInt
    audio_seconds: Seconds
    chunk_count: NonNegInt
    stop: Literal["eos", "length"] = "eos"
    usage: Usage = Usage()


class Failed(Event, tag="failed", kw_only=True, frozen=True):
    """Terminal: the request failed; audio already published (chunk_count chunks) stays valid.

    Attributes:
        stage: the service that failed.
        code: machine-readable reason.
        reason: what happened and what to change, for a person.
        frames: codec frames generated before the failure.
        chunk_count: audio chunks published before the failure.
    """

    KIND: ClassVar[str] = subjects.TERMINAL_KIND
    stage: Stage
    code: ErrorCode
    reason: str
    frames: NonNegInt = 0
    chunk_count: NonNegInt = 0


TerminalEvent = Finished | Failed
"""What `tts.events.<id>.terminal` holds: exactly one per request."""

LifecycleEvent = Accepted | Started | FirstFrame | FirstAudio | Preempted | Resumed | Migrated | Finished | Failed
"""Anything on `tts.events.>`."""


def event_subject(event: Event) -> str:
    """The subject an event is published on: `tts.events.<id>.<kind>`."""
    return subjects.event(event.request_id, event.KIND)
