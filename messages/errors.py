"""Closed sets of machine-readable codes, and the typed errors of the message layer.

Every `failed` terminal event, `CodesEnd` and error reply names one `ErrorCode` and the `Stage` that failed, so a
client or an operator can act on it without parsing prose.
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """The service (actor) a failure is attributed to."""

    GATEWAY = "gateway"
    DECODE = "decode"
    MTP = "mtp"
    VOCODER = "vocoder"
    PREFILL = "prefill"


class ErrorCode(StrEnum):
    """Why a request failed. A closed set: add a member here before using a new code anywhere."""

    INVALID_REQUEST = "invalid_request"  # the request itself is malformed or out of range
    TEXT_TOO_LONG = "text_too_long"  # text over the character limit (4096)
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_VOICE = "unknown_voice"
    UNKNOWN_LANGUAGE = "unknown_language"
    QUEUE_FULL = "queue_full"  # REQUESTS is at its bound; the gateway answers 429
    TIMEOUT = "timeout"  # queued past its deadline
    POISON = "poison"  # MaxDeliver exhausted on REQUESTS (seen through the JetStream advisory)
    BAD_MESSAGE = "bad_message"  # an undecodable message; termed, never retried
    CAPACITY = "capacity"  # cannot fit the KV pool even alone
    PREEMPTED = "preempted"  # capacity preemption under `recompute_preemption: fail`; audio is truncated
    DRAINED = "drained"  # operator drain of a `fail` request
    REPLICA_LOST = "replica_lost"  # the owning replica died (past the migration limit)
    CANCELLED = "cancelled"  # client cancel, or the resume window ran out
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"  # a hand-off or step made for other weights
    MODEL_ERROR = "model_error"  # the model raised while serving this request
    INVALID_CONFIG = "invalid_config"  # a service or bus setting out of range (not a request failure)
    INTERNAL = "internal"  # a bug: anything not covered above


class MessageError(ValueError):
    """Base of the message layer's errors; `code` is machine-readable."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DecodeError(MessageError):
    """Bytes that are not a valid message of the expected type (malformed, wrong tag, bad field, other schema)."""

    code = ErrorCode.BAD_MESSAGE


class InvalidToken(MessageError):
    """A value that cannot be a subject or key token (empty, or holds characters NATS gives meaning to)."""

    code = ErrorCode.INVALID_REQUEST


class InvalidConfig(MessageError):
    """A bus setting out of range; raised at startup, before anything is provisioned."""

    code = ErrorCode.INVALID_CONFIG
