"""Taking requests from REQUESTS: pull only when the engine has room, claim, ack, announce, hand to the engine.

Per request: check it against the checkpoint (no weights needed); claim `owner.<id>` by compare-and-set (epoch 1),
or resolve the claim already there by its owner's lease (ours from an earlier delivery: continue unless it is being
served or was ended here; a dead owner's with no codes emitted yet: take it over, epoch + 1; a live other owner's:
ack and skip); ack; publish the TakeoverMarker (so the vocoder learns the owner at once) and Started; queue it in the
engine. A dead owner that had emitted codes is left to the vocoder, which ends the request `replica_lost` after the
audio so far (migrating it, replaying the emitted frames, is not implemented yet). A request the checkpoint cannot serve ends with CodesEnd
failed `invalid_request`. Undecodable messages are termed by the bus's PullConsumer, which keeps serving.
"""

from __future__ import annotations

import asyncio
import logging

from messages import DecodeError, subjects
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.events import Failed, Started
from messages.requests import SynthesisRequest
from messages.streams import CODES_STREAM, REQUESTS_STREAM, requests_consumer
from services.bus.claims import ClaimKind, OwnerClaim, RequestClaim, resolve_request_claim
from services.bus.codes_publisher import CodesPublisher
from services.bus.errors import OwnershipConflict
from services.bus.fencing import last_subject_sequence
from services.bus.kvstore import read_cancel
from services.bus.pull_consumer import Delivery, PullConsumer
from services.bus.terminal_guard import publish_terminal
from services.decode.active import ActiveRequest
from services.decode.codes_stream import ChunkRule, CodesStream
from services.decode.core import DecodeCore, Ending
from services.decode.worker import EngineWorker
from services.decode.request_check import Admission, AdmissionError, admit
from services.engine.engine import Engine
from services.engine.sequence import RequestOutcome
from services.model.errors import ModelError

log = logging.getLogger(__name__)

IN_PROGRESS_EVERY_S = 5.0  # well inside REQUESTS' ack wait (30 s)


class Intake:
    """The REQUESTS side of the decode service."""

    def __init__(self, core: DecodeCore, *, fetch_timeout_s: float = 1.0) -> None:
        self.core = core
        self.consumer = PullConsumer(
            core.js, core.nc, stream=REQUESTS_STREAM, durable=requests_consumer(core.served.name),
            message_type=SynthesisRequest, handler=self.handle, capacity=core.capacity,
            max_batch=core.settings.max_num_seqs, fetch_timeout_s=fetch_timeout_s, concurrent=True,
            on_refused=self._refused)
        self.admission = EngineWorker("decode-admission")
        """Builds prompts and queues requests in the engine, beside the engine thread's steps."""

    async def run(self, stop: asyncio.Event) -> None:
        """Pull and admit until `stop` is set."""
        await self.consumer.bind()
        try:
            await self.consumer.run(stop)
        finally:
            await self._unsubscribe()
            self.admission.close()

    async def _unsubscribe(self) -> None:
        """Drop the pull subscription before the connection drains (see PullConsumer.close)."""
        await self.consumer.close()

    async def handle(self, request: SynthesisRequest, delivery: Delivery) -> None:
        """One delivered request (this call holds one capacity slot; it is released when the request ends)."""
        core = self.core
        await self._while_paused(delivery)
        try:
            admission: Admission | AdmissionError = admit(request, core.served, core.settings)
        except AdmissionError as exc:
            admission = exc
        claim = await self._claim(request)
        if claim is None:  # not ours to serve: this delivery is done with
            await delivery.ack()
            core.capacity.release()
            return
        epoch = claim.record.epoch
        await delivery.ack()
        active = await self._take_over(request, admission, epoch)
        if active is None:
            return
        if isinstance(admission, AdmissionError):
            log.warning("request %s refused: %s", request.id, admission.message)
            error = ErrorInfo(code=admission.code, stage=Stage.DECODE, message=admission.message)
            await core.end(active, Ending(error=error))
            return
        await core.emit(Started(request_id=request.id, at=core.now(), replica=core.replica, epoch=epoch,
                                queued_s=max(0.0, core.now() - request.created_at) if request.created_at else 0.0))
        await self._start(active, admission)

    async def _refused(self, error: DecodeError) -> None:
        """A request whose message could not be decoded (a bad body, another schema version) but whose id could: it
        ends here with one `failed` terminal naming why (the message itself is already termed, never redelivered)."""
        core = self.core
        event = Failed(request_id=error.request_id, at=core.now(), stage=Stage.DECODE, code=error.code,
                       reason=f"decode could not read this request's message ({error}); send it again as this "
                              "version of the gateway builds it")
        if await publish_terminal(core.js, error.request_id, event):
            core.stats.record_failure(error.code.value)
            log.warning("request %s refused: %s", error.request_id, error)

    async def _while_paused(self, delivery: Delivery) -> None:
        """A drain began while this message's fetch was in flight: keep it (unclaimed, unacked) until the drain
        ends, telling the server we are still on it so it is not redelivered meanwhile."""
        while self.core.capacity.is_paused:
            try:
                await asyncio.wait_for(self.core.capacity.unpaused.wait(), IN_PROGRESS_EVERY_S)
            except asyncio.TimeoutError:
                await delivery.in_progress()

    async def _claim(self, request: SynthesisRequest) -> OwnerClaim | None:
        """This replica's claim on a delivered request, or None when it is not ours to serve (it says why)."""
        core = self.core

        async def nothing_emitted(_claim: OwnerClaim | None = None) -> bool:
            codes = subjects.codes(subjects.partition_for(request.id, core.settings.num_partitions), request.id)
            return await last_subject_sequence(core.js, CODES_STREAM, codes) == 0

        resolved: RequestClaim = await resolve_request_claim(core.kv, request.id, core.replica,
                                                             may_take_over=nothing_emitted)
        owner, epoch = resolved.claim.record.replica, resolved.claim.record.epoch
        if resolved.kind is ClaimKind.LIVE_OWNER:
            log.info("request %s is owned by live replica %s (epoch %d); acking and skipping", request.id, owner,
                     epoch)
            return None
        if resolved.kind is ClaimKind.DEAD_OWNER_KEPT:
            log.warning("request %s: its owner %s died after emitting codes; the vocoder ends it (replica_lost)",
                        request.id, owner)
            return None
        if resolved.kind is ClaimKind.OURS and (request.id in core.active or not await nothing_emitted()):
            log.info("request %s redelivered while this replica serves it, or after it ended here; acking",
                     request.id)
            return None
        if resolved.previous is not None:
            log.warning("request %s: took it over (epoch %d) from %s, whose lease is dead", request.id, epoch,
                        resolved.previous.record.replica)
        return resolved.claim

    async def _take_over(self, request: SynthesisRequest, admission: Admission | AdmissionError, epoch: int
                         ) -> ActiveRequest | None:
        """Publish the TakeoverMarker and register the request as owned here."""
        core = self.core
        partition = subjects.partition_for(request.id, core.settings.num_partitions)
        try:
            publisher = await CodesPublisher.take_over(
                core.js, partition=partition, request_id=request.id, epoch=epoch, replica=core.replica,
                last_sequence=0, resume_frame=0, next_seq=0)
        except OwnershipConflict as exc:
            log.warning("request %s: %s; standing down", request.id, exc)
            core.capacity.release()
            return None
        initial = request.initial_chunk_frames or core.settings.initial_chunk_frames
        stream = CodesStream(request.id, epoch, publisher, ChunkRule(initial, core.settings.chunk_frames))
        input_tokens = admission.input_tokens if isinstance(admission, Admission) else 0
        active = ActiveRequest(request, stream, input_tokens=input_tokens)
        core.active.add(active)
        core.stats.requests_started += 1
        return active

    async def _start(self, active: ActiveRequest, admission: Admission) -> None:
        """Queue the request in the engine, unless it was cancelled while it waited on REQUESTS."""
        core = self.core
        try:
            cancel = await read_cancel(core.kv, admission.request_id)
        except Exception:  # noqa: BLE001 - the cancel watcher still catches a cancel written later
            log.exception("request %s: could not read its cancel key; starting it", admission.request_id)
            cancel = None
        if cancel is not None:
            error = ErrorInfo(code=cancel.code, stage=Stage.GATEWAY, message=cancel.reason)
            await core.end(active, Ending(error=error))
            return
        if admission.request.clone is not None and core.voices is not None:
            try:  # the reference audio's work runs on its own thread (or comes from the cache)
                admission = await core.voices.attach(admission)
            except AdmissionError as exc:
                await core.end(active, Ending(error=ErrorInfo(code=exc.code, stage=Stage.DECODE, message=exc.message)))
                return
        try:
            # On the admission thread: the prompt is built while the engine thread steps.
            outcome, active.num_prompt_tokens = await self.admission.run(_add_to_engine, core.engine, admission)
        except ModelError as exc:
            code = ErrorCode.INVALID_REQUEST if exc.code.startswith(("unknown", "empty")) else ErrorCode.MODEL_ERROR
            await core.end(active, Ending(error=ErrorInfo(code=code, stage=Stage.DECODE, message=exc.message)))
            return
        except Exception as exc:  # noqa: BLE001 - a request the model chokes on fails alone; the replica serves on
            log.exception("request %s: the engine refused it", admission.request_id)
            message = f"the decode engine could not start this request ({type(exc).__name__}: {exc})"
            await core.end(active, Ending(error=ErrorInfo(code=ErrorCode.MODEL_ERROR, stage=Stage.DECODE,
                                                          message=message)))
            return
        if outcome is not None:  # cannot fit the KV pool even alone: capacity, at once
            await core.end_outcome(outcome)
            return
        if active.is_closed:  # cancelled while it was being queued: the abort came before the add
            await core.worker.run(core.engine.abort_request, admission.request_id)
            return
        core.wake()


def _add_to_engine(engine: Engine, admission: Admission) -> tuple[RequestOutcome | None, int]:
    """(On the engine thread.) Queue the request; its immediate outcome (capacity) if any, and its prompt length."""
    outcome = engine.add_request(admission.request_id, admission.prompt, admission.request.seed, admission.params,
                                 admission.max_new_frames, predictor_params=admission.predictor_params,
                                 ignore_eos=admission.request.ignore_eos,
                                 min_new_frames=admission.request.min_new_tokens)
    return outcome, engine.num_prompt_tokens(admission.request_id) or 0

