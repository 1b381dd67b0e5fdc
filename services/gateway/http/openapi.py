"""What the gateway's OpenAPI schema (`GET /openapi.json`) says beyond what FastAPI infers from the routes.

The speech route decodes its body with msgspec, not pydantic, so FastAPI sees no body: the schema of `SpeechBody`
is generated from the same Struct the route decodes, so the document and the parser never differ. Every error
answer is documented in OpenAI's shape (`{"error": {...}}`, services/gateway/errors.py), and the audio answers by
their media types. tests/bus/test_http_fuzz.py holds the gateway to this document with schemathesis.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from messages.errors import ErrorCode, Stage
from services.gateway.requests.body import SpeechBody
from services.gateway.requests.response_formats import FORMATS
from services.gateway.requests.voice_body import VoiceBody

_REF = "#/components/schemas/{name}"


class ErrorObject(msgspec.Struct, kw_only=True):
    """OpenAI's error object, plus the stage that failed and the request id.

    Attributes:
        message: what was wrong and what to change, for a person.
        type: "invalid_request_error", "rate_limit_error" or "server_error".
        param: the body field at fault, when one is.
        code: machine-readable reason.
        stage: the service the failure is attributed to.
        request_id: the request (its X-Request-Id), when it had one.
    """

    message: str
    type: str
    param: str | None
    code: ErrorCode
    stage: Stage
    request_id: str | None


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every error answer of the HTTP API."""

    error: ErrorObject


class SpeechEvent(msgspec.Struct, kw_only=True):
    """The JSON of one server-sent event of `stream_format: sse` (services/gateway/http/sse.py says each kind).

    Attributes:
        type: "speech.audio.delta", "speech.audio.done" or "error".
        audio: base64 of the next bytes of the audio file (delta).
        usage: tokens of the request (done).
        error: the failure, as in an error answer (error).
    """

    type: Literal["speech.audio.delta", "speech.audio.done", "error"]
    audio: str | None = None
    usage: dict[str, Any] | None = None
    error: ErrorObject | None = None


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of a route that may answer `statuses` with an error body."""
    return {status: {"description": _ERROR_DESCRIPTIONS[status],
                     "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}}}
            for status in statuses}


_ERROR_DESCRIPTIONS = {
    400: "The body is malformed, out of range or names what this server lacks (code says which); nothing queued.",
    401: "API keys are configured and the call carries no valid one (`invalid_api_key`).",
    404: "No such model (`unknown_model`) or saved voice (`unknown_voice`).",
    409: "The request was cancelled (`cancelled`).",
    429: "REQUESTS is full (`queue_full`), or this gateway holds its --max-live-requests (`too_many_requests`); "
         "Retry-After says when to try again.",
    500: "A bug (`internal`); the request id is in the gateway's logs.",
    503: "The mesh could not serve it (`capacity`, `preempted`, `drained`, `replica_lost`).",
    504: "Queued past its deadline (`timeout`).",
}

SPEECH_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": _REF.format(name="SpeechBody")}}}}}

VOICE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": _REF.format(name="VoiceBody")}}}}}

_INTEGER = {"type": "integer"}

SPEECH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The audio: a whole file, a byte stream (`stream_format: audio`, or `stream: true`) or "
                         "server-sent events (`stream_format: sse`).",
          "headers": {
              "X-Sample-Rate": {"required": True, "schema": _INTEGER,
                                "description": "Samples per second of the audio: the body's `sample_rate`, or "
                                               "the format's default (24000; 8000 for ulaw and alaw)."},
              "X-Channels": {"schema": _INTEGER, "description": "Channels (1), on headerless formats."},
              "X-Bit-Depth": {"schema": _INTEGER, "description": "Bits per sample, on headerless formats (pcm: 16, "
                                                                 "ulaw and alaw: 8)."}},
          "content": {**{fmt.media_type: {"schema": {"type": "string", "format": "binary"}}
                         for fmt in FORMATS.values()},
                      # An SSE event as clients parse it: its `data` line holds the JSON of a SpeechEvent.
                      "text/event-stream": {"schema": {
                          "type": "object", "required": ["data"],
                          "properties": {"data": {"type": "string", "contentMediaType": "application/json",
                                                  "contentSchema": {"$ref": _REF.format(name="SpeechEvent")}},
                                         "event": {"type": "string"}, "id": {"type": "string"}}}}}},
    **error_responses(400, 401, 409, 429, 500, 503, 504),
}

READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {"description": "Not ready; `reasons` says what is missing.",
          "content": {"application/json": {"schema": {"type": "object"}}}},
}

METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}},
    **error_responses(401),
}


def documented_openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with the msgspec schemas it refers to (built once, then cached on the app)."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        _, components = msgspec.json.schema_components([SpeechBody, VoiceBody, ErrorBody, SpeechEvent],
                                                       ref_template=_REF)
        document.setdefault("components", {}).setdefault("schemas", {}).update(components)
        _drop_unreachable_422(document)
        app.openapi_schema = document
    return app.openapi_schema


def _drop_unreachable_422(document: dict[str, Any]) -> None:
    """FastAPI documents a 422 for every route with parameters; ours are plain strings that never fail pydantic's
    validation, and the body is msgspec's to refuse (400), so a 422 is never answered."""
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = document["components"]["schemas"]
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
