"""Leaving cleanly: owned requests get a grace period to finish; whatever is left ends with `drained`."""

from __future__ import annotations

import asyncio
import logging

from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from services.decode.core import DecodeCore, Ending

log = logging.getLogger(__name__)

SHUTDOWN_REASON = ("the decode replica shut down before this request finished, so the output generated so far is "
                   "truncated; retry the request")


async def finish_or_end(core: DecodeCore, grace_s: float) -> None:
    """Wait up to `grace_s` for every owned request to end; end the rest (one CodesEnd each) and free their KV."""
    if len(core.active) == 0:
        return
    log.info("shutting down: waiting up to %.1fs for %d requests to finish", grace_s, len(core.active))
    try:
        await asyncio.wait_for(core.active.is_empty.wait(), grace_s)
        return
    except asyncio.TimeoutError:
        pass
    error = ErrorInfo(code=ErrorCode.DRAINED, stage=Stage.DECODE, message=SHUTDOWN_REASON)
    for active in core.active.all():
        await core.worker.run(core.engine.abort_request, active.request_id)
        await core.end(active, Ending(error=error))
