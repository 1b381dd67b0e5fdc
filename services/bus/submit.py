"""Putting a request on REQUESTS: a full queue (bounded, discard new) becomes a typed QueueFull (HTTP 429)."""

from __future__ import annotations

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError

from messages import encode, subjects
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM
from services.bus.errors import JS_MAX_MESSAGES_EXCEEDED, NotProvisioned, QueueFull


async def submit_request(js: JetStreamContext, request: SynthesisRequest, *, headers: dict[str, str] | None = None,
                         timeout_s: float = 5.0, msg_id: str | None = None, subject: str | None = None) -> int:
    """Publish `request` on `subject` (default `tts.req.<model>`, decode's queue); returns its REQUESTS sequence.

    The Msg-Id (the request id unless `msg_id` names another, as a requeue for migration does) makes a retried submit
    within the duplicate window stored once. Raises QueueFull when REQUESTS is at its bound, NotProvisioned when the
    stream does not exist.
    """
    all_headers = dict(headers or {})
    all_headers[api.Header.MSG_ID.value] = msg_id or request.id
    try:
        ack = await js.publish(subject or subjects.request(request.model), encode(request), timeout=timeout_s,
                               stream=REQUESTS_STREAM, headers=all_headers)
    except APIError as exc:
        if exc.err_code == JS_MAX_MESSAGES_EXCEEDED:
            raise QueueFull(f"the request queue is full ({exc.description}); retry later") from exc
        raise
    except NoStreamResponseError as exc:
        raise NotProvisioned(f"no stream takes {subjects.request(request.model)}: is model {request.model!r} "
                             f"provisioned? run `voxmesh provision`") from exc
    return ack.seq
