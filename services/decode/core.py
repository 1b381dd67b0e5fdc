"""What the decode service's parts share: the engine and its thread, the owned requests, and the ways a request's
codes are published and ended (exactly one CodesEnd per request, unless another owner fenced this one out)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages import encode
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.events import Event, Failed, event_subject
from messages.frames import CodesChunk, CodesEnd
from services.bus.claims import read_owner
from services.bus.errors import StaleOwner
from services.bus.logs import request_context
from services.bus.terminal_guard import publish_terminal
from services.decode.active import ActiveRequest, ActiveRequests
from services.decode.capacity import EngineCapacity
from services.decode.launch_turns import LaunchTurns
from services.decode.request_check import ServedModel
from services.decode.settings import DecodeSettings
from services.decode.stats import DecodeStats, StepSeconds
from services.decode.voice_prompts import VoicePrompts
from services.decode.worker import EngineWorker
from services.engine.engine import Engine
from services.engine.sequence import FailureCode, RequestOutcome, SequenceStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a request ends on the wire: finished with `stop`, or failed with `error`."""

    stop: str | None = None
    error: ErrorInfo | None = None



# The engine's failure codes as the bus names them; a failed model step is the model's error.
_ENGINE_CODES = {
    FailureCode.CAPACITY: ErrorCode.CAPACITY,
    FailureCode.PREEMPTED: ErrorCode.PREEMPTED,
    FailureCode.DRAINED: ErrorCode.DRAINED,
    FailureCode.STEP_FAILED: ErrorCode.MODEL_ERROR,
}

def ending_of(outcome: RequestOutcome) -> Ending:
    """The CodesEnd content of an engine outcome."""
    if outcome.status == SequenceStatus.FINISHED_EOS:
        return Ending(stop="eos")
    if outcome.status == SequenceStatus.FINISHED_LENGTH:
        return Ending(stop="length")
    if outcome.status == SequenceStatus.CANCELLED:
        return Ending(error=ErrorInfo(code=ErrorCode.CANCELLED, stage=Stage.GATEWAY, message="cancelled"))
    code = _ENGINE_CODES.get(outcome.code, ErrorCode.INTERNAL) if outcome.code is not None else ErrorCode.INTERNAL
    return Ending(error=ErrorInfo(code=code, stage=Stage.DECODE, message=outcome.reason or code.value))


class DecodeCore:
    """Shared state and the publishing rules. Every engine call goes through `worker`."""

    def __init__(self, *, nc: Client, js: JetStreamContext, kv: KeyValue, engine: Engine, worker: EngineWorker,
                 served: ServedModel, settings: DecodeSettings, replica: str, step_seconds: StepSeconds,
                 turns: LaunchTurns, voices: VoicePrompts | None = None) -> None:
        """`step_seconds` and `turns` are the engine's step sink and launch listener (given to it when it was
        built, `service.build_engine`): the core reads the one and waits on the other."""
        self.nc, self.js, self.kv = nc, js, kv
        self.voices = voices
        """Voice prompts of cloned voices (base checkpoints only)."""
        self.engine, self.worker = engine, worker
        self.served, self.settings, self.replica = served, settings, replica
        self.capacity = EngineCapacity(engine, settings.interactive_seats_of())
        self.active = ActiveRequests()
        self.stats = DecodeStats()
        self.step_seconds = step_seconds
        """The engine's step times (STATS `step_seconds`)."""
        self.turns = turns
        """The engine thread's launches, which the loop's heavy work waits out."""
        self.work = asyncio.Event()
        """Set when the engine may have work (a request was queued, a drain ended); the frame loop waits on it."""

    def wake(self) -> None:
        self.work.set()

    async def emit(self, event: Event) -> None:
        """Publish a lifecycle event on EVENTS. A lost event is logged, never fatal to the request."""
        try:
            await self.js.publish(event_subject(event), encode(event))
        except Exception as exc:  # noqa: BLE001 - events are informational; the codes path carries the truth
            log.warning("could not publish %s for %s: %r", type(event).__name__, event.request_id, exc)

    def now(self) -> float:
        return time.time()

    async def flush(self, active: ActiveRequest) -> None:
        """Publish every full chunk its pending frames make."""
        async with active.lock:
            if active.is_closed:
                return
            await self._publish(active, active.stream.take_ready_chunks())

    async def end(self, active: ActiveRequest, ending: Ending) -> bool:
        """Publish the remaining frames (a shorter last chunk) and the CodesEnd; release the request.

        False when it had already ended here or another owner fenced this replica out.
        """
        async with active.lock:
            if active.is_closed:
                return False
            stream = active.stream
            messages: list[CodesChunk | CodesEnd] = list(stream.take_rest())
            if ending.error is None:
                messages.append(stream.finished(ending.stop or "eos", active.usage()))
            else:
                messages.append(stream.failed(ending.error, active.usage()))
            if not await self._publish(active, messages):
                return False
            active.is_closed = True
        self._count(ending)
        self._release(active)
        log.info("request %s ended: %s (%d frames, %d chunks)", active.request_id,
                 ending.stop or (ending.error.code.value if ending.error else "?"),
                 stream.num_published_frames, stream.next_seq)
        return True

    async def end_outcome(self, outcome: RequestOutcome) -> None:
        """End the request an engine outcome names (finished, preempted, drained, capacity...)."""
        active = self.active.get(outcome.request_id)
        if active is not None:
            with request_context(outcome.request_id):
                await self.end(active, ending_of(outcome))

    async def _publish(self, active: ActiveRequest, messages: list[CodesChunk | CodesEnd]) -> bool:
        """Append under the request's lock (each append retried through a bus blip). On StaleOwner the request stops
        here without a terminal (its new owner ends it); when an append failed every retry, the request stops here
        too, and unless another replica has taken it over meanwhile (this one cut off from the bus long enough for
        its lease to lapse: the new owner ends it, and a `failed` from here could end it under its audio), its
        `failed` terminal (`internal`) is published directly through the guard, since no CodesEnd will reach the
        vocoder: the frame loop and the other requests go on."""
        error: Exception | None = None
        try:
            await active.stream.publish(messages)
            return True
        except StaleOwner as exc:
            log.warning("request %s: %s", active.request_id, exc)
            fenced_out = True
        except Exception as exc:  # noqa: BLE001 - one request's lost publish never stops the replica
            owner = await self._owner_other_than_us(active)
            fenced_out = owner is not None
            if fenced_out:
                log.warning("request %s: its codes could not be appended (%r), and %s owns it now (epoch %d after "
                            "ours, %d): fenced out, standing down", active.request_id, exc, owner[0], owner[1],
                            active.stream.epoch)
            else:
                log.exception("request %s: publishing its codes failed through every retry; failing it",
                              active.request_id)
                error = exc
        active.is_closed = True
        await self.worker.run(self.engine.abort_request, active.request_id)
        if fenced_out:
            self.stats.requests_stood_down += 1
        else:
            self.stats.requests_failed += 1
            self.stats.record_failure(ErrorCode.INTERNAL.value)
            await self._fail_directly(active, error or RuntimeError("unknown"))
        self._release(active)
        return False

    async def _owner_other_than_us(self, active: ActiveRequest) -> tuple[str, int] | None:
        """(replica, epoch) of the request's owner when a later claim than this replica's holds it (read from the
        bucket's leader); None when this replica still owns it, or when the bus does not answer either."""
        try:
            claim = await read_owner(self.kv, active.request_id)
        except Exception:  # noqa: BLE001 - the bus is still away: nothing says another replica has it
            return None
        if claim is None or claim.record.epoch == active.stream.epoch:
            return None
        return claim.record.replica, claim.record.epoch

    async def _fail_directly(self, active: ActiveRequest, error: Exception) -> None:
        """The terminal a lost CodesEnd would have produced: `failed`, `internal`, stage decode, naming the chunks
        that did land (the gateway completes the client's stream once it holds them)."""
        stream = active.stream
        reason = (f"decode could not append this request's codes to CODES ({type(error).__name__}: {error}) through "
                  f"{stream.retry.attempts} attempts; the {stream.num_landed_chunks} audio chunks already sent are "
                  "valid: retry the request (same seed for the same audio)")
        event = Failed(request_id=active.request_id, at=self.now(), stage=Stage.DECODE, code=ErrorCode.INTERNAL,
                       reason=reason, frames=stream.num_landed_frames, chunk_count=stream.num_landed_chunks)
        try:
            await publish_terminal(self.js, active.request_id, event)
        except Exception:  # noqa: BLE001 - the bus is away: the gateway's request timeout ends it
            log.exception("request %s: its failed terminal could not be published either; the gateway's request "
                          "timeout will end it", active.request_id)

    def _count(self, ending: Ending) -> None:
        if ending.error is not None:
            self.stats.record_failure(ending.error.code.value)
        if ending.error is None:
            self.stats.requests_finished += 1
        elif ending.error.code in (ErrorCode.CANCELLED, ErrorCode.TIMEOUT):
            self.stats.requests_cancelled += 1
        elif ending.error.code == ErrorCode.INVALID_REQUEST:
            self.stats.requests_invalid += 1
        else:
            self.stats.requests_failed += 1

    def _release(self, active: ActiveRequest) -> None:
        """Forget the request and give its intake slot back (once)."""
        if self.active.remove(active.request_id) is not None:
            self.capacity.release(active.request.priority)
            if active.span is not None:
                active.span.end()
