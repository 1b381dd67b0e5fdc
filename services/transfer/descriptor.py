"""Reading a transfer descriptor: the bytes a hand-off carries, checked before anything is posted."""

from __future__ import annotations

from messages.codec import decode
from messages.errors import DecodeError, TransferCode
from messages.kv_transfer import TransferDescriptor
from services.transfer.errors import TransferFailed


def describe(descriptor: bytes) -> TransferDescriptor:
    """The descriptor in `descriptor`; TransferFailed (`malformed`) when the bytes are not a valid one."""
    try:
        return decode(descriptor, TransferDescriptor)
    except DecodeError as exc:
        raise TransferFailed(TransferCode.MALFORMED, f"not a KV transfer descriptor: {exc}") from exc
