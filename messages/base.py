"""The base of every message: a tagged msgspec Struct carrying a schema version, plus shared field types."""

from __future__ import annotations

from typing import Annotated

import msgspec

from messages.errors import ErrorCode, MessageError, Stage

# Bump only on an incompatible change. Compatible additions are new fields with defaults appended at the end, which
# older readers ignore (msgspec skips unknown map keys and extra trailing array items).
SCHEMA_VERSION = 1

RequestId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
ReplicaName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(gt=0)]
Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
UnixTime = Annotated[float, msgspec.Meta(ge=0)]  # seconds since the epoch
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class Message(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Base of every bus message. Subclasses set `tag=` (their wire name).

    Attributes:
        schema: the schema version the sender wrote (`SCHEMA_VERSION`); a reader refuses another.
    """

    schema: int = SCHEMA_VERSION


class HotMessage(Message, array_like=True, kw_only=True, frozen=True):
    """A hot-path message: encoded as an array (no field names on the wire)."""


class InvalidMessage(MessageError):
    """A message whose fields contradict each other (e.g. a byte length that is not a whole number of frames)."""

    code = ErrorCode.BAD_MESSAGE


class ErrorInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A failure, attributed.

    Attributes:
        code: machine-readable reason (closed set).
        stage: the service that failed.
        message: what happened and what to change, for a person.
    """

    code: ErrorCode
    stage: Stage
    message: str


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """What a request consumed.

    Attributes:
        input_chars: characters of input text.
        input_tokens: text tokens after tokenization.
        prompt_tokens: positions of the prefill (text + codec prefix + speaker rows).
        output_frames: codec frames generated (12.5 per second of audio).
    """

    input_chars: NonNegInt = 0
    input_tokens: NonNegInt = 0
    prompt_tokens: NonNegInt = 0
    output_frames: NonNegInt = 0
