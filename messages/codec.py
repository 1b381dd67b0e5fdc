"""msgpack encoding of bus messages, with a typed error on anything that is not a valid message."""

from __future__ import annotations

import re
from typing import Any, TypeVar, overload

import msgspec

from messages.base import SCHEMA_VERSION, Message
from messages.errors import DecodeError, ErrorCode

T = TypeVar("T", bound=Message)

_encoder = msgspec.msgpack.Encoder()
_any_decoder = msgspec.msgpack.Decoder()
_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # messages.base.RequestId
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: Message) -> bytes:
    """msgpack bytes of one message (its tag and schema version included)."""
    if not isinstance(message, Message):
        raise TypeError(f"encode() takes a messages.Message, got {type(message).__name__}")
    return _encoder.encode(message)


@overload
def decode(data: bytes, expected: type[T]) -> T: ...
@overload
def decode(data: bytes, expected: Any) -> Any: ...
def decode(data: bytes, expected: Any) -> Any:
    """Decode `data` as `expected` (a message type or a union of tagged message types).

    Raises DecodeError (code `bad_message`) on malformed bytes, an unknown or unexpected tag, a field out of range,
    or another schema version.
    """
    decoder = _decoders.get(expected)
    if decoder is None:
        decoder = msgspec.msgpack.Decoder(expected)
        _decoders[expected] = decoder
    try:
        message = decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise _refusal(data, f"not a valid {_name(expected)}: {exc}") from exc
    if message.schema != SCHEMA_VERSION:
        raise _refusal(data, f"{type(message).__name__} has schema version {message.schema}; this reader speaks "
                             f"{SCHEMA_VERSION}")
    return message


def _refusal(data: bytes, reason: str) -> DecodeError:
    """The DecodeError of undecodable `data`, with what its envelope still tells: the request it names and
    whether it was written in another schema version (then `unsupported_version`, whatever else is wrong)."""
    schema, request_id = read_envelope(data)
    if schema is not None and schema != SCHEMA_VERSION:
        return DecodeError(f"schema version {schema}, this reader speaks {SCHEMA_VERSION}: {reason}",
                           ErrorCode.UNSUPPORTED_VERSION, request_id=request_id)
    return DecodeError(reason, ErrorCode.BAD_MESSAGE, request_id=request_id)


def read_envelope(data: bytes) -> tuple[int | None, str | None]:
    """(schema version, request id) of a message whose body may not decode: from a map (`schema`, `id` or
    `request_id`) or an array-like message ([tag, schema, request_id, ...]); None for whatever is unreadable."""
    try:
        value = _any_decoder.decode(data)
    except msgspec.DecodeError:
        return None, None
    if isinstance(value, dict):
        schema, request_id = value.get("schema"), value.get("id", value.get("request_id"))
    elif isinstance(value, list) and len(value) >= 3:
        schema, request_id = value[1], value[2]
    else:
        return None, None
    schema = schema if isinstance(schema, int) and not isinstance(schema, bool) else None
    readable = isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) is not None
    return schema, request_id if readable else None


def _name(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected)
