"""Server-sent events of `POST /v1/audio/speech` with `stream_format: "sse"`, shaped like OpenAI's:

    data: {"type": "speech.audio.delta", "audio": "<base64 of the next bytes of the response_format's file>"}
    data: {"type": "speech.audio.done", "usage": {"input_tokens": .., "output_tokens": .., "total_tokens": ..}, ...}

or, when the request fails after some audio, `data: {"type": "error", "error": {message, type, param, code, ...}}`
as the last event. Only `data:` lines are sent (no `event:` names), so a browser EventSource's `onmessage` sees
every event; the JSON's `type` says which it is.
"""

from __future__ import annotations

import base64
import json

from messages.events import Finished
from services.gateway.errors import GatewayError

MEDIA_TYPE = "text/event-stream"


def sse_event(payload: dict) -> bytes:
    """One event: a `data:` line of compact JSON and the blank line that ends it."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta_event(audio: bytes) -> bytes:
    """`speech.audio.delta` carrying the next bytes of the audio file, base64."""
    return sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode("ascii")})


def done_event(request_id: str, finished: Finished | None, *, num_samples: int, sample_rate: int) -> bytes:
    """`speech.audio.done` with OpenAI's usage (input tokens: text tokens; output tokens: codec frames) and
    voxmesh's account of the audio."""
    usage = finished.usage if finished is not None else None
    input_tokens = usage.input_tokens if usage is not None else 0
    output_tokens = usage.output_frames if usage is not None else 0
    return sse_event({
        "type": "speech.audio.done",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "total_tokens": input_tokens + output_tokens},
        "request_id": request_id,
        "chunk_count": finished.chunk_count if finished is not None else 0,
        "frames": finished.frames if finished is not None else 0,
        "stop": finished.stop if finished is not None else None,
        "duration_s": num_samples / sample_rate,
    })


def error_event(error: GatewayError) -> bytes:
    """`error` in OpenAI's error shape (the same object a JSON error response carries under "error")."""
    return sse_event({"type": "error", **error.body()})
