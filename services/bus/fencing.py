"""Server-side fencing: publishes that only land if the subject's last sequence is what the writer expects.

`Nats-Expected-Last-Subject-Sequence` makes the server refuse a writer that is behind (another owner appended);
`Nats-Msg-Id` lets a plain retry be recognised. The server checks the expectation before the duplicate window, so a
retry whose first attempt did land is refused too: on a refusal we read the subject's last message, and if it
carries our own Msg-Id the earlier attempt won and the publish counts as done.
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from services.bus.errors import WRONG_LAST_SEQUENCE_CODES

log = logging.getLogger(__name__)

EXPECTED_LAST_SUBJECT_SEQUENCE = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
MSG_ID = api.Header.MSG_ID.value


async def fenced_publish(js: JetStreamContext, subject: str, payload: bytes, *, stream: str, expected: int,
                         msg_id: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0,
                         attempts: int = 3) -> api.PubAck | None:
    """Publish only if `subject`'s last sequence in `stream` is `expected` (0: no message yet).

    Returns the PubAck (duplicate=True when an earlier attempt of this same publish had landed), or None when the
    server refused because another writer got there first. Retries on a lost ack with the same headers.
    """
    all_headers = dict(headers or {})
    all_headers[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected)
    all_headers[MSG_ID] = msg_id
    for attempt in range(attempts):
        try:
            return await js.publish(subject, payload, timeout=timeout_s, stream=stream, headers=dict(all_headers))
        except APIError as exc:
            if exc.err_code not in WRONG_LAST_SEQUENCE_CODES:
                raise
            return await _ack_if_ours(js, stream, subject, msg_id)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            if attempt + 1 == attempts:
                raise
            log.warning("no ack for %s on %s (attempt %d); retrying with the same Msg-Id", msg_id, subject,
                        attempt + 1)
    return None  # unreachable: the loop returns or raises


async def _ack_if_ours(js: JetStreamContext, stream: str, subject: str, msg_id: str) -> api.PubAck | None:
    try:
        last = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    if last.headers and last.headers.get(MSG_ID) == msg_id:
        return api.PubAck(stream=stream, seq=last.seq, duplicate=True)
    return None


async def last_subject_sequence(js: JetStreamContext, stream: str, subject: str) -> int:
    """The stream sequence of the last message on `subject`, 0 when it has none."""
    try:
        return (await js.get_last_msg(stream, subject)).seq
    except NotFoundError:
        return 0
