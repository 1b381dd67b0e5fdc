"""The terminal event of a request that reached the vocoder: Finished or Failed, exactly once.

Exactly once is the server's doing (`services.bus.terminal_guard.publish_terminal`: expected last subject sequence 0); this
module builds the events from what the vocoder voiced and what decode said in CodesEnd, and a caller that loses the
race (another stage ended the request first) logs and stands down.
"""

from __future__ import annotations

import logging
import time

from nats.js import JetStreamContext

from messages.errors import ErrorCode, Stage
from messages.events import Failed, Finished, TerminalEvent
from messages.frames import CodesEnd
from services.bus.terminal_guard import publish_terminal
from services.bus.trace_context import inject

log = logging.getLogger(__name__)


class TerminalPublisher:
    """Builds and publishes terminal events through the guard."""

    def __init__(self, js: JetStreamContext, *, sample_rate: int, samples_per_frame: int) -> None:
        self._js = js
        self.sample_rate = sample_rate
        self.samples_per_frame = samples_per_frame
        self.num_won = 0
        self.num_lost = 0
        self.num_won_by_code: dict[str, int] = {}
        """Terminals this replica published, by "finished" or the failure's code (for /metrics)."""

    def after_end(self, end: CodesEnd, *, chunk_count: int, frames: int) -> TerminalEvent:
        """The terminal for a CodesEnd, once `chunk_count` audio chunks holding `frames` frames are out."""
        if frames != end.total_frames or chunk_count != end.seq:
            log.warning("voiced %d frames in %d chunks; CodesEnd says %d frames in %d chunks", frames, chunk_count,
                        end.total_frames, end.seq)
        if end.reason == "finished":
            return Finished(request_id=end.request_id, at=time.time(), frames=frames,
                            audio_seconds=frames * self.samples_per_frame / self.sample_rate,
                            chunk_count=chunk_count, stop=end.stop or "eos", usage=end.usage)
        error = end.error
        if error is None:  # CodesEnd's own validation makes this impossible; keep the event well-formed anyway
            raise ValueError(f"CodesEnd of {end.request_id} failed without an error")
        return Failed(request_id=end.request_id, at=time.time(), stage=error.stage, code=error.code,
                      reason=error.message, frames=frames, chunk_count=chunk_count)

    @staticmethod
    def decode_replica_lost(request_id: str, owner: str | None, *, frames: int, chunk_count: int) -> Failed:
        """The decode replica producing the request died and nobody took it over."""
        who = f"decode replica {owner}" if owner else "the decode replica"
        reason = (f"{who} stopped renewing its lease while generating this request and no replica took it over; "
                  f"the {chunk_count} audio chunks already sent are valid. Retry the request (same seed for the "
                  f"same audio); if this repeats, check the decode replicas' health and logs.")
        return Failed(request_id=request_id, at=time.time(), stage=Stage.DECODE, code=ErrorCode.REPLICA_LOST,
                      reason=reason, frames=frames, chunk_count=chunk_count)

    @staticmethod
    def vocoder_failure(request_id: str, code: ErrorCode, reason: str, *, frames: int, chunk_count: int) -> Failed:
        """The vocoder itself cannot voice the request (bad codes, codes missing from CODES, a codec error)."""
        return Failed(request_id=request_id, at=time.time(), stage=Stage.VOCODER, code=code, reason=reason,
                      frames=frames, chunk_count=chunk_count)

    async def publish(self, event: TerminalEvent) -> bool:
        """Publish through the guard; True when this call ended the request, False when another stage had."""
        # The terminal event carries the trace context of the span that ends the request (the vocoder's codes span).
        won = await publish_terminal(self._js, event.request_id, event, headers=inject())
        if won:
            self.num_won += 1
            key = event.code.value if isinstance(event, Failed) else "finished"
            self.num_won_by_code[key] = self.num_won_by_code.get(key, 0) + 1
            log.info("request %s ended: %s (%d chunks)", event.request_id, type(event).__name__, event.chunk_count)
        else:
            self.num_lost += 1
            log.info("request %s was already ended by another stage; standing down", event.request_id)
        return won
