"""msgpack encoding of bus messages, with a typed error on anything that is not a valid message."""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

from messages.base import SCHEMA_VERSION, Message
from messages.errors import DecodeError, ErrorCode

T = TypeVar("T", bound=Message)

_encoder = msgspec.msgpack.Encoder()
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
        raise DecodeError(f"not a valid {_name(expected)}: {exc}") from exc
    if message.schema != SCHEMA_VERSION:
        raise DecodeError(
            f"{type(message).__name__} has schema version {message.schema}; this reader speaks {SCHEMA_VERSION}",
            ErrorCode.BAD_MESSAGE,
        )
    return message


def _name(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected)
