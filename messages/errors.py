"""The registry of machine-readable codes (closed sets), and the typed errors of the message layer.

Every `failed` terminal event, `CodesEnd` and error reply names one `ErrorCode` and the `Stage` that failed, so a
client or an operator can act on it without parsing prose. The services' own typed errors, which no request carries,
name a `FaultCode`. A code is added here before it is used anywhere; how a code maps to a transport (an HTTP status,
say) stays with the service that speaks that transport, keyed by these members.
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
    # Refinements of a bad client body, so HTTP/WebSocket clients can branch without parsing prose.
    INVALID_JSON = "invalid_json"  # the body is not JSON
    INVALID_TYPE = "invalid_type"  # a field (or the body) has the wrong JSON type
    OUT_OF_RANGE = "out_of_range"  # a number or length outside its allowed range
    INVALID_VALUE = "invalid_value"  # a value outside a field's closed set of choices
    UNKNOWN_FIELD = "unknown_field"  # a field the API does not have (a typo is refused, not ignored)
    MISSING_FIELD = "missing_field"  # a required field is absent
    EMPTY_INPUT = "empty_input"  # the text is empty or only whitespace
    NOTHING_TO_SAY = "nothing_to_say"  # the text has no letter or digit (only punctuation, symbols or emoji)
    CONTROL_CHARACTERS = "control_characters"  # the text holds control characters other than tab and line breaks
    UNSUPPORTED_FORMAT = "unsupported_format"  # an audio response_format this server cannot encode
    UNSUPPORTED_VALUE = "unsupported_value"  # a valid API value this server does not implement (e.g. speed != 1)
    # Fields of the servers clients migrate from (vLLM-Omni, SGLang-Omni) on the speech body.
    UNSUPPORTED_FIELD = "unsupported_field"  # a known field of another server that this one cannot honour
    CONFLICTING_FIELDS = "conflicting_fields"  # two fields that say different things (stream and stream_format...)
    TASK_TYPE_MISMATCH = "task_type_mismatch"  # a task_type other than what the served checkpoint does
    INVALID_API_KEY = "invalid_api_key"  # API keys are configured and the call carries no valid one
    NOT_FOUND = "not_found"  # no such endpoint or resource
    TEXT_TOO_LONG = "text_too_long"  # text over the character limit (4096)
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_VOICE = "unknown_voice"
    UNKNOWN_LANGUAGE = "unknown_language"
    # Voice cloning (base checkpoints): the reference audio and its transcript.
    INVALID_REF_AUDIO = "invalid_ref_audio"  # not a readable audio data URI, or a sample rate it cannot take
    REF_AUDIO_TOO_SHORT = "ref_audio_too_short"
    REF_AUDIO_TOO_LONG = "ref_audio_too_long"
    REF_TEXT_REQUIRED = "ref_text_required"  # in-context cloning without the reference's transcript
    VOICE_REQUIRED = "voice_required"  # a base model's request with neither reference audio nor a saved voice
    VOICE_CLONING_UNSUPPORTED = "voice_cloning_unsupported"  # reference audio for a model that cannot clone
    QUEUE_FULL = "queue_full"  # REQUESTS is at its bound; the gateway answers 429
    TOO_MANY_REQUESTS = "too_many_requests"  # the gateway has its limit of requests in flight; it answers 429
    # A key's own limits (the keys file), held across every gateway of a mesh: 429 with Retry-After, nothing queued.
    RATE_LIMITED = "rate_limited"  # the key's requests per second (its token bucket) are spent
    TOO_MANY_LIVE_REQUESTS = "too_many_live_requests"  # the key has its limit of requests live at once
    QUOTA_EXCEEDED = "quota_exceeded"  # the key's audio seconds of this UTC day are spent
    PRIORITY_NOT_ALLOWED = "priority_not_allowed"  # a priority above what the key may use (403)
    SLOW_CLIENT = "slow_client"  # the client read its audio so slowly that the gateway's buffer for it overflowed
    # Refinements of a bad WebSocket message (the socket stays open, except for a message over the size limit).
    BINARY_FRAME = "binary_frame"  # a binary frame where the protocol takes JSON text
    MESSAGE_TOO_BIG = "message_too_big"  # a message over the socket's size limit; the socket closes with 1009
    INPUT_CLOSED = "input_closed"  # a message after `input.done`: the session takes no more input
    NOT_RESUMABLE = "not_resumable"  # a resume naming a request this gateway cannot resume (unknown, or another's)
    TIMEOUT = "timeout"  # queued past its deadline, or not ended within the request timeout
    POISON = "poison"  # MaxDeliver exhausted on REQUESTS (seen through the JetStream advisory)
    BAD_MESSAGE = "bad_message"  # an undecodable message; termed, never retried
    UNSUPPORTED_VERSION = "unsupported_version"  # a message of a schema version this reader does not speak; termed
    CAPACITY = "capacity"  # cannot fit the KV pool even alone
    PREEMPTED = "preempted"  # capacity preemption under `recompute_preemption: fail`; audio is truncated
    DRAINED = "drained"  # operator drain of a `fail` request
    REPLICA_LOST = "replica_lost"  # the owning replica died (past the migration limit)
    CANCELLED = "cancelled"  # client cancel, or the resume window ran out
    BUS_UNAVAILABLE = "bus_unavailable"  # the gateway heard neither audio nor events of a request for too long
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"  # a hand-off or step made for other weights
    MODEL_ERROR = "model_error"  # the model raised while serving this request
    INVALID_CONFIG = "invalid_config"  # a service or bus setting out of range (not a request failure)
    INTERNAL = "internal"  # a bug: anything not covered above


class FaultCode(StrEnum):
    """Why a service's own step failed (at startup, on the bus): the code of a typed error that is logged or shown
    by the CLI, never carried by a request's failure (that is an ErrorCode)."""

    BUS_ERROR = "bus_error"  # a bus runtime error without a more specific code
    STALE_OWNER = "stale_owner"  # a codes publish refused: another owner appended since (a takeover)
    OWNERSHIP_CONFLICT = "ownership_conflict"  # a compare-and-set claim lost to another writer
    NOT_PROVISIONED = "not_provisioned"  # a stream, consumer or the bucket does not exist: run `voxmesh provision`
    PROVISION_CONFLICT = "provision_conflict"  # an existing stream differs in a way the server cannot update
    NATS_SERVER = "nats_server"  # the embedded nats-server could not be found, started or stopped


class TransferCode(StrEnum):
    """Why a KV transfer (services.transfer) failed: a fetch's typed error, and the offering replica's refusal."""

    STALLED = "stalled"  # the watchdog fired: no reply, or the data did not arrive, within the fetch's timeout
    UNKNOWN = "unknown"  # the offering replica does not hold that tag (expired, fetched, restarted, a stale attempt)
    UNREACHABLE = "unreachable"  # no replica answers on the offer's subject, or UCX lost the connection to it
    MISMATCH = "mismatch"  # the offer and the receiving buffer disagree in size
    MALFORMED = "malformed"  # a transfer descriptor or reply that does not decode


class MessageError(ValueError):
    """Base of the message layer's errors; `code` is machine-readable."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DecodeError(MessageError):
    """Bytes that are not a valid message of the expected type (malformed, wrong tag, bad field: `bad_message`;
    another schema version: `unsupported_version`).

    Attributes:
        request_id: the request the message names, when its envelope is readable (so the request can be ended
            with one terminal event instead of waiting out its deadline); None otherwise.
    """

    code = ErrorCode.BAD_MESSAGE

    def __init__(self, message: str, code: ErrorCode | None = None, *, request_id: str | None = None) -> None:
        super().__init__(message, code)
        self.request_id = request_id


class InvalidToken(MessageError):
    """A value that cannot be a subject or key token (empty, or holds characters NATS gives meaning to)."""

    code = ErrorCode.INVALID_REQUEST


class InvalidConfig(MessageError):
    """A bus setting out of range; raised at startup, before anything is provisioned."""

    code = ErrorCode.INVALID_CONFIG
