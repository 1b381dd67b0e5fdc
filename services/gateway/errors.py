"""The gateway's typed errors and how each becomes an HTTP status and an OpenAI-shaped error body.

Every error names a machine-readable `ErrorCode` (the closed set of `messages.errors`), so clients branch on the
code and people read the message. The body follows OpenAI's shape (`{"error": {message, type, param, code}}`) so
existing clients surface it unchanged.
"""

from __future__ import annotations

from http import HTTPStatus

from messages.errors import ErrorCode, Stage
from messages.events import Failed

# HTTP status of a failed request, by code. Request-shape problems are the client's (4xx); the rest say which part
# of the mesh could not serve it (5xx), so retries and alerts can tell them apart.
STATUS_OF_CODE: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_JSON: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_TYPE: HTTPStatus.BAD_REQUEST,
    ErrorCode.OUT_OF_RANGE: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_VALUE: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNKNOWN_FIELD: HTTPStatus.BAD_REQUEST,
    ErrorCode.MISSING_FIELD: HTTPStatus.BAD_REQUEST,
    ErrorCode.EMPTY_INPUT: HTTPStatus.BAD_REQUEST,
    ErrorCode.NOTHING_TO_SAY: HTTPStatus.BAD_REQUEST,
    ErrorCode.CONTROL_CHARACTERS: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNSUPPORTED_FORMAT: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNSUPPORTED_VALUE: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNSUPPORTED_FIELD: HTTPStatus.BAD_REQUEST,
    ErrorCode.CONFLICTING_FIELDS: HTTPStatus.BAD_REQUEST,
    ErrorCode.TASK_TYPE_MISMATCH: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_API_KEY: HTTPStatus.UNAUTHORIZED,
    ErrorCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.TEXT_TOO_LONG: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNKNOWN_MODEL: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNKNOWN_VOICE: HTTPStatus.BAD_REQUEST,
    ErrorCode.UNKNOWN_LANGUAGE: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_REF_AUDIO: HTTPStatus.BAD_REQUEST,
    ErrorCode.REF_AUDIO_TOO_SHORT: HTTPStatus.BAD_REQUEST,
    ErrorCode.REF_AUDIO_TOO_LONG: HTTPStatus.BAD_REQUEST,
    ErrorCode.REF_TEXT_REQUIRED: HTTPStatus.BAD_REQUEST,
    ErrorCode.VOICE_REQUIRED: HTTPStatus.BAD_REQUEST,
    ErrorCode.VOICE_CLONING_UNSUPPORTED: HTTPStatus.BAD_REQUEST,
    ErrorCode.QUEUE_FULL: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.TOO_MANY_REQUESTS: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.RATE_LIMITED: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.TOO_MANY_LIVE_REQUESTS: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.QUOTA_EXCEEDED: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.PRIORITY_NOT_ALLOWED: HTTPStatus.FORBIDDEN,
    ErrorCode.SLOW_CLIENT: HTTPStatus.REQUEST_TIMEOUT,
    ErrorCode.BINARY_FRAME: HTTPStatus.BAD_REQUEST,
    ErrorCode.MESSAGE_TOO_BIG: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ErrorCode.INPUT_CLOSED: HTTPStatus.CONFLICT,
    ErrorCode.NOT_RESUMABLE: HTTPStatus.NOT_FOUND,
    ErrorCode.TIMEOUT: HTTPStatus.GATEWAY_TIMEOUT,
    ErrorCode.CAPACITY: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.PREEMPTED: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.DRAINED: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.REPLICA_LOST: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.CANCELLED: HTTPStatus.CONFLICT,
    ErrorCode.BUS_UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
}


def error_type(status: int) -> str:
    """OpenAI's error `type`: a rate limit, a client mistake (any other 4xx), or the server's failure."""
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        return "rate_limit_error"
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def status_of(code: ErrorCode) -> int:
    """The HTTP status that answers a request failed with `code`."""
    return int(STATUS_OF_CODE.get(code, HTTPStatus.INTERNAL_SERVER_ERROR))


class GatewayError(Exception):
    """A request the gateway answers with an error.

    Attributes:
        code: machine-readable reason.
        message: what was wrong and what to change, for a person.
        param: the body field at fault, when one is.
        retry_after_s: seconds a client should wait before retrying (sent as Retry-After), when it applies.
        stage: the service that failed (gateway for admission errors).
    """

    def __init__(self, code: ErrorCode, message: str, *, param: str | None = None,
                 retry_after_s: int | None = None, stage: Stage = Stage.GATEWAY, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.stage = stage
        self.request_id: str | None = None  # set once the request has an id
        self._status = status

    @property
    def status(self) -> int:
        """The HTTP status: the code's, unless this error fixed another."""
        return self._status if self._status is not None else status_of(self.code)

    def body(self) -> dict:
        """OpenAI's error shape, plus the stage and the request id where known."""
        return {"error": {"message": self.message, "type": error_type(self.status),
                          "param": self.param, "code": self.code.value, "stage": self.stage.value,
                          "request_id": self.request_id}}

    def headers(self) -> dict[str, str]:
        """Retry-After when it applies, X-Request-Id when the request had an id."""
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        if self.request_id is not None:
            headers["X-Request-Id"] = self.request_id
        return headers


class AdmissionError(GatewayError):
    """The client's body is malformed or out of range (HTTP 400); nothing was queued."""


class Overloaded(GatewayError):
    """REQUESTS is full (`queue_full`), or this gateway has its limit of requests in flight (`too_many_requests`):
    HTTP 429 with Retry-After; nothing was queued."""

    def __init__(self, message: str, retry_after_s: int, code: ErrorCode = ErrorCode.QUEUE_FULL) -> None:
        super().__init__(code, message, retry_after_s=retry_after_s)


class RequestFailed(GatewayError):
    """An admitted request ended with a `failed` terminal event (or the gateway could not complete its audio)."""

    def __init__(self, code: ErrorCode, message: str, *, stage: Stage, chunk_count: int = 0) -> None:
        super().__init__(code, message, stage=stage)
        self.chunk_count = chunk_count

    @classmethod
    def from_event(cls, event: Failed) -> RequestFailed:
        return cls(event.code, event.reason, stage=event.stage, chunk_count=event.chunk_count)


def http_error(status: int, detail: str) -> GatewayError:
    """A framework-level HTTP error (404 unknown path, 405 wrong method...) as a GatewayError."""
    code = ErrorCode.NOT_FOUND if status == HTTPStatus.NOT_FOUND else ErrorCode.INVALID_REQUEST
    return GatewayError(code, f"{detail}: see GET /v1/models and POST /v1/audio/speech", status=status)


def internal_error(error: Exception) -> GatewayError:
    """An unexpected exception (a bug) as a 500 that names its type, never its internals."""
    return GatewayError(ErrorCode.INTERNAL, f"internal error ({type(error).__name__}); the request id is in the "
                        "logs: report it", status=HTTPStatus.INTERNAL_SERVER_ERROR)
