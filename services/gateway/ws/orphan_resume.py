"""Resuming a request whose own gateway died.

The gateway that streamed a request remembers it for the resume window (resume.py). When that gateway dies (a kill,
a crash), its clients lose their sockets but their requests go on in the mesh: decode and the vocoder finish them,
and CODES keeps their codes for the resume window after they end. A client that reconnects (to the restarted
gateway, or another one) and sends `resume` for a request this gateway never knew is served from the bus: the
request must exist (its `accepted` event is in EVENTS) and must not have ended more than a resume window ago; the
chunks after `last_seq` are re-decoded from CODES, the rest arrive live. The client's `last_seq` is taken on trust
(the dead gateway's count of chunks sent is gone with it), bounded by the chunk count of an ended request.

An adopted request is not supervised here (its SynthesisRequest went with the dead gateway, so it cannot be
requeued): a decode replica lost meanwhile ends it through the vocoder's migration grace.
"""

from __future__ import annotations

import logging
import time

from nats.js.errors import NotFoundError

from messages import subjects
from messages.errors import ErrorCode
from messages.events import Accepted
from messages.streams import EVENTS_STREAM
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.ws.resume import ParkedRequest, ResumeRefused, ResumeRegistry, stored_terminal

log = logging.getLogger(__name__)


async def adopt_orphan(synthesizer: Synthesizer, registry: ResumeRegistry, request_id: str,
                       last_seq: int | None) -> ParkedRequest | None:
    """The request as a resume may take it (attached to the resuming socket from here on), or None when the mesh
    does not know it (the caller's own refusal stands). Raises ResumeRefused when it ended past the window or the
    client names a chunk that was never made."""
    if not registry.is_unknown(request_id) or not await _was_accepted(synthesizer, request_id):
        return None
    now = time.time()
    terminal = await stored_terminal(synthesizer.js, request_id)
    if terminal is not None and not registry.window.is_open(terminal.at, now):
        raise ResumeRefused(ErrorCode.CANCELLED, f"request {request_id} ended {now - terminal.at:.1f}s ago, past the "
                            f"{registry.window.length_s:g}s resume window: its audio is no longer kept; send the text "
                            "again as a new request", param="request_id")
    if terminal is not None and last_seq is not None and last_seq >= terminal.chunk_count:
        raise ResumeRefused(ErrorCode.OUT_OF_RANGE, f"last_seq {last_seq} was never sent: request {request_id} "
                            f"has chunks 0..{terminal.chunk_count - 1}", param="last_seq")
    count = 0 if last_seq is None else last_seq + 1
    parked = ParkedRequest(request_id, subjects.partition_for(request_id, synthesizer.num_partitions), sent=count,
                           received=count, left_at=now)
    registry.attach(request_id)
    log.info("adopted request %s from a gateway that is gone (the client resumes after chunk %s)", request_id,
             last_seq)
    return parked


async def _was_accepted(synthesizer: Synthesizer, request_id: str) -> bool:
    try:
        await synthesizer.js.get_last_msg(EVENTS_STREAM, subjects.event(request_id, Accepted.KIND))
    except NotFoundError:
        return False
    return True
