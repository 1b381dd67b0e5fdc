"""Server-side fencing: publishes that only land if the subject's last sequence is what the writer expects.

`Nats-Expected-Last-Subject-Sequence` makes the server refuse a writer that is behind (another owner appended);
`Nats-Msg-Id` lets a plain retry be recognised. The server checks the expectation before the duplicate window, so a
retry whose first attempt did land is refused too: on a refusal we read the subject's last message, and if it
carries our own Msg-Id the earlier attempt won and the publish counts as done.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from services.bus.ack_retry import DEFAULT_RETRY, AckRetry, publish_acked, retrying
from services.bus.errors import WRONG_LAST_SEQUENCE_CODES

log = logging.getLogger(__name__)

EXPECTED_LAST_SUBJECT_SEQUENCE = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
MSG_ID = api.Header.MSG_ID.value


async def fenced_publish(js: JetStreamContext, subject: str, payload: bytes, *, stream: str, expected: int,
                         msg_id: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0,
                         retry: AckRetry = DEFAULT_RETRY) -> api.PubAck | None:
    """Publish only if `subject`'s last sequence in `stream` is `expected` (0: no message yet).

    Returns the PubAck (duplicate=True when an earlier attempt of this same publish had landed), or None when the
    server refused because another writer got there first. A lost ack, a leader election or a reconnect (`ack_retry`)
    is retried with the same headers; if the earlier attempt had landed, the retry is refused (the subject moved past
    `expected`) and the subject's last message, read from the leader, shows it was ours.
    """
    all_headers = dict(headers or {})
    all_headers[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected)
    all_headers[MSG_ID] = msg_id
    try:
        return await publish_acked(js, subject, payload, stream=stream, headers=all_headers, timeout_s=timeout_s,
                                   retry=retry)
    except APIError as exc:
        if exc.err_code not in WRONG_LAST_SEQUENCE_CODES:
            raise
    return await retrying(lambda: _ack_if_ours(js, stream, subject, msg_id), f"read the last {subject}", retry)


async def _ack_if_ours(js: JetStreamContext, stream: str, subject: str, msg_id: str) -> api.PubAck | None:
    try:
        last = await js.get_last_msg(stream, subject, direct=False)  # from the leader: see last_subject_sequence
    except NotFoundError:
        return None
    if last.headers and last.headers.get(MSG_ID) == msg_id:
        return api.PubAck(stream=stream, seq=last.seq, duplicate=True)
    return None


async def last_subject_sequence(js: JetStreamContext, stream: str, subject: str) -> int:
    """The stream sequence of the last message on `subject`, 0 when it has none.

    Read with `$JS.API.STREAM.MSG.GET` (nats-py's `get_last_msg` without `direct`), which only the stream's leader
    answers: the sequence a takeover expects must be the one the leader will check the next append against, and a
    follower (what a direct get may reach) can still be behind it. Retried through an election (`ack_retry`)."""
    async def read() -> int:
        try:
            return (await js.get_last_msg(stream, subject, direct=False)).seq
        except NotFoundError:
            return 0

    return await retrying(read, f"read the last {subject}")
