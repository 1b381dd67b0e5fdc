"""The bus contract: every subject, stream, consumer, bucket and message type of voxmesh.

- `messages.subjects`: subject and KV key builders, `slug()`.
- `messages.streams`: stream/consumer/bucket names and `BusConfig`.
- `messages.requests`, `messages.frames`, `messages.events`, `messages.records`, `messages.mtp`: message types.
- `messages.voice_clone`: voice cloning: a request's cloned voice, the reference-audio and saved-voice object stores.
- `encode(msg) -> bytes`, `decode(bytes, type_or_union) -> msg` (raises `DecodeError`).
- `messages.errors`: the registry of codes, `ErrorCode` (a request's failure), `FaultCode` (a service's own errors),
  `Stage`, and the typed errors.
- `messages.audio_format`: the audio the mesh carries (sample rate, samples per frame...).
"""

from messages.base import SCHEMA_VERSION, ErrorInfo, InvalidMessage, Message, Usage
from messages.codec import decode, encode
from messages.errors import DecodeError, ErrorCode, FaultCode, InvalidConfig, InvalidToken, MessageError, Stage
from messages.events import (
    Accepted,
    Failed,
    Finished,
    FirstAudio,
    FirstFrame,
    LifecycleEvent,
    Migrated,
    Preempted,
    Resumed,
    Started,
    TerminalEvent,
    event_subject,
)
from messages.frames import AudioChunk, CodesChunk, CodesEnd, CodesMessage, TakeoverMarker
from messages.mtp import PrefillHandoff, StepReply, StepRequest
from messages.records import CancelRecord, Lease, OwnerRecord, PartitionOwner
from messages.requests import MAX_TEXT_CHARS, RedecodeReply, RedecodeRequest, SamplingSpec, SynthesisRequest

__all__ = [
    "SCHEMA_VERSION", "Accepted", "AudioChunk", "CancelRecord", "CodesChunk", "CodesEnd", "CodesMessage",
    "DecodeError", "ErrorCode", "ErrorInfo", "Failed", "FaultCode", "Finished", "FirstAudio", "FirstFrame",
    "InvalidConfig", "InvalidMessage", "InvalidToken", "Lease", "LifecycleEvent", "MAX_TEXT_CHARS", "Message",
    "MessageError", "Migrated", "OwnerRecord", "PartitionOwner", "Preempted", "PrefillHandoff", "RedecodeReply",
    "RedecodeRequest", "Resumed", "SamplingSpec", "Stage", "Started", "StepReply", "StepRequest", "SynthesisRequest",
    "TakeoverMarker", "TerminalEvent", "Usage", "decode", "encode", "event_subject",
]
