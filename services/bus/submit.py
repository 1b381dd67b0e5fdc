"""Putting a request on REQUESTS: a full queue (bounded, discard new) becomes a typed QueueFull (HTTP 429)."""

from __future__ import annotations

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from messages import encode, subjects
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM
from services.bus.ack_retry import DEFAULT_RETRY, AckRetry, retrying
from services.bus.errors import JS_MAX_MESSAGES_EXCEEDED, NotProvisioned, QueueFull


async def submit_request(js: JetStreamContext, request: SynthesisRequest, *, headers: dict[str, str] | None = None,
                         timeout_s: float = 5.0, msg_id: str | None = None, subject: str | None = None,
                         retry: AckRetry = DEFAULT_RETRY) -> int:
    """Publish `request` on `subject` (default: decode's lane for the request's priority and tenant,
    `tts.req.<model>.<priority>.<lane>`); returns its REQUESTS sequence.

    The Msg-Id (the request id unless `msg_id` names another, as a requeue for migration does) makes a retried submit
    within the duplicate window stored once: a submit that meets a leader election or a reconnect (no ack, no
    responders, 503) is retried with it (`ack_retry`). Raises QueueFull when REQUESTS is at its bound, NotProvisioned
    when no stream takes the subject.
    """
    target = subject or subjects.request_for(request.model, request.priority, request.tenant)
    all_headers = dict(headers or {})
    all_headers[api.Header.MSG_ID.value] = msg_id or request.id
    payload = encode(request)

    async def publish_once() -> api.PubAck:
        try:
            return await js.publish(target, payload, timeout=timeout_s, stream=REQUESTS_STREAM,
                                    headers=dict(all_headers))
        except APIError as exc:
            if exc.err_code == JS_MAX_MESSAGES_EXCEEDED:
                raise QueueFull(f"the request queue is full ({exc.description}); retry later") from exc
            raise
        except NoStreamResponseError:
            await _require_stream(js, target, request.model)
            raise  # the stream exists, without a leader for now: transient, retried

    return (await retrying(publish_once, f"submit {all_headers[api.Header.MSG_ID.value]} on {target}", retry)).seq


async def _require_stream(js: JetStreamContext, subject: str, model: str) -> None:
    """NotProvisioned when the server knows no stream for `subject` (a "no responders" then is no election)."""
    try:
        await js.find_stream_name_by_subject(subject)
    except NotFoundError as exc:
        raise NotProvisioned(f"no stream takes {subject}: is model {model!r} provisioned? run `voxmesh provision`") \
            from exc
