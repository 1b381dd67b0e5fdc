"""Taking requests from REQUESTS: pull only when the engine has room, claim, ack, announce, hand to the engine.

Per request: check it against the checkpoint (no weights needed); claim `owner.<id>` by compare-and-set (epoch 1),
or resolve the claim already there by its owner's lease (ours from an earlier delivery: continue unless it is being
served or was ended here; a live other owner's: ack and skip; a dead owner's: take it over, epoch + 1, unless the
request already ended); publish the TakeoverMarker (so the vocoder learns the owner at once); ack; publish Started;
queue it in the engine. A request taken over from a dead owner is migrated (migration.py): it continues from the frames
its dead owner left in CODES, or past `--max-migrations` ends `replica_lost`. A request the checkpoint cannot serve
ends with CodesEnd failed `invalid_request`. Undecodable messages are termed by the bus's PullConsumer, which keeps
serving.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import numpy as np
import torch
from opentelemetry.trace import Span, SpanKind

from messages import DecodeError, subjects
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.events import Failed, FirstFrame, Migrated, Started
from messages.mtp import PrefillHandoff
from messages.records import CancelRecord
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM, request_lanes, requests_consumer
from services.bus.claims import ClaimKind, OwnerClaim, RequestClaim, resolve_request_claim
from services.bus.codes_publisher import CodesPublisher
from services.bus.errors import OwnershipConflict
from services.bus.kvstore import read_cancel
from services.bus.laned_pull import LanedPull
from services.bus.pull_consumer import Delivery, PullConsumer
from services.bus.terminal_guard import publish_terminal
from services.bus.trace_context import REQUEST_ID, extract, inject, span_context, tracer
from services.decode.active import ActiveRequest
from services.decode.codes_stream import ChunkRule, CodesStream
from services.decode.core import DecodeCore, Ending
from services.decode.handoffs import HandoffFetcher, first_frame
from services.decode.voice_records import ready_prompt
from services.model.voice.errors import ReferenceAudioError
from services.decode.migration import Resume, has_ended, past_limit_error, read_resume
from services.decode.worker import EngineWorker
from services.decode.request_check import Admission, RequestRefused, admit
from services.engine.engine import Engine
from services.engine.engine_request import EngineRequest
from services.engine.errors import InvalidRequestError
from services.engine.sequence import RequestOutcome
from services.model.errors import ModelError

log = logging.getLogger(__name__)

Owned = tuple[ActiveRequest, Admission | RequestRefused, Resume, RequestClaim]
"""A request this replica took: its registration, its admission check, where it resumes, the claim."""

IN_PROGRESS_EVERY_S = 5.0  # well inside REQUESTS' ack wait (30 s)
TAKEOVER_ATTEMPTS = 3  # each lost race means a stale owner appended just now; the next read shows it
TAKEOVER_RETRY_S = 1.0  # after TAKEOVER_ATTEMPTS lost races: a stale owner appends at once but is fenced soon


class Intake:
    """The REQUESTS side of the decode service."""

    def __init__(self, core: DecodeCore, *, fetch_timeout_s: float = 1.0) -> None:
        self.core = core
        model = core.served.name
        # Interactive lanes first, batch lanes as far as the seats kept for interactive work allow, the lanes of a
        # priority in turn (services.bus.laned_pull).
        lanes = LanedPull(core.js, core.nc, stream=REQUESTS_STREAM, model=model, lanes=request_lanes(model),
                          capacity=core.capacity)
        self.consumer = PullConsumer(
            core.js, core.nc, stream=REQUESTS_STREAM, durable=requests_consumer(model),
            message_type=SynthesisRequest | PrefillHandoff, handler=self.handle, capacity=core.capacity,
            max_batch=core.settings.max_num_seqs, fetch_timeout_s=fetch_timeout_s, concurrent=True,
            on_refused=self._refused, request_id_of=_request_id_of, source=lanes, kind_of=_priority_of)
        self.handoffs = HandoffFetcher(core)
        """Fetches the prompt KV of requests prefilled remotely."""
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
            await self.handoffs.close()

    async def _unsubscribe(self) -> None:
        """Drop the pull subscription before the connection drains (see PullConsumer.close)."""
        await self.consumer.close()

    async def handle(self, message: SynthesisRequest | PrefillHandoff, delivery: Delivery) -> None:
        """One delivered request, or one prefilled remotely (this call holds one capacity slot; it is released when
        the request ends)."""
        handoff = message if isinstance(message, PrefillHandoff) else None
        request = message.request if handoff is not None else message
        core = self.core
        await core.turns.launched()  # decoding and checking a request is Python: not beside a step's launch
        await self._while_paused(delivery)
        # The request's span continues the gateway's (its context came in the message's headers); it lives until
        # the request leaves this replica (DecodeCore._release), and every codes message of the request carries it.
        span = tracer().start_span("decode.request", context=extract(delivery.headers), kind=SpanKind.CONSUMER,
                                   attributes={REQUEST_ID: request.id, "voxmesh.replica": core.replica})
        try:
            owned = await self._own(request, delivery, span)
        except BaseException:
            span.end()
            raise
        if owned is None:
            span.end()
            return
        # The cancel key is read from here on (now that the request is registered, the cancel watcher sees any
        # cancel written after the read), beside the round trips that follow, not after them.
        cancel = asyncio.ensure_future(self._read_cancel(request.id))
        try:
            await self._serve(request, handoff, owned, cancel)
        finally:
            cancel.cancel()

    async def _serve(self, request: SynthesisRequest, handoff: PrefillHandoff | None, owned: Owned,
                     cancel: asyncio.Future) -> None:
        """A request owned here: ended at once if it cannot go on, else announced and queued in the engine."""
        core = self.core
        active, admission, resume, resolved = owned
        epoch = resolved.claim.record.epoch
        lost = past_limit_error(epoch, core.settings.max_migrations, resume)
        if lost is not None:
            log.warning("request %s: %s", request.id, lost.message)
            await core.end(active, Ending(error=lost))
            return
        if resolved.previous is not None:
            core.stats.requests_migrated += 1
            previous = resolved.previous.record.replica
            await core.emit(Migrated(request_id=request.id, at=core.now(), from_replica=previous,
                                     to_replica=core.replica, epoch=epoch, frames_done=resume.num_frames))
        if isinstance(admission, RequestRefused):
            log.warning("request %s refused: %s", request.id, admission.message)
            error = ErrorInfo(code=admission.code, stage=Stage.DECODE, message=admission.message)
            await core.end(active, Ending(error=error))
            return
        started = Started(request_id=request.id, at=core.now(), replica=core.replica, epoch=epoch,
                          queued_s=max(0.0, core.now() - request.created_at) if request.created_at else 0.0)
        await asyncio.gather(core.emit(started), asyncio.shield(cancel))  # two round trips at once
        # Another checkpoint's hand-off is not used at all: the request is prefilled here from its prompt.
        handed_over = handoff is not None and await self.handoffs.made_here(handoff)
        if handed_over and handoff.voice is not None:
            self._take_voice(handoff)
        frames, prompt_kv = resume.frames, None
        if handed_over and resume.num_frames == 0:  # a takeover continues from CODES instead
            prompt_kv = await self.handoffs.fetch(handoff)
            frames = first_frame(handoff)
            active.stream.add_frame(0, frames[0])
            await core.emit(FirstFrame(request_id=request.id, at=core.now(), replica=core.replica))
        await self._start(active, admission, frames, cancel, prompt_kv)

    def _take_voice(self, handoff: PrefillHandoff) -> None:
        """Keep the voice prompt the prefill replica computed, so this request's `attach` (and a replay after a
        preemption) skips the reference audio's work; one that will not load is computed here instead."""
        voices, clone = self.core.voices, handoff.request.clone
        if voices is None or clone is None:
            return
        try:
            voices.prime(clone, ready_prompt(handoff.voice))
        except ReferenceAudioError as exc:
            log.warning("request %s: the voice prompt handed over is unusable (%s); computing it here",
                        handoff.request.id, exc)

    async def _own(self, request: SynthesisRequest, delivery: Delivery, span: Span) -> Owned | None:
        """Claim, check and take the request over; None when it is not this replica's to serve now (the delivery
        acked, or nakked for a redelivery)."""
        core = self.core
        resolved = await self._claim(request)
        if resolved is None:  # not ours to serve: this delivery is done with
            await delivery.ack()
            core.capacity.release(request.priority)
            return None
        epoch = resolved.claim.record.epoch
        admission = self._admit(request, is_takeover=epoch > 1)
        # Acked once the marker is out: a bus error before that naks the message, and its redelivery resumes the
        # request from this replica's own claim.
        taken = await self._take_over(request, admission, epoch, span, is_new=resolved.kind is ClaimKind.NEW)
        if taken is None:  # its codes kept moving: try again on a redelivery, from this replica's own claim
            await delivery.nak(TAKEOVER_RETRY_S)
            return None
        await delivery.ack()
        active, resume = taken
        return active, admission, resume, resolved

    def _admit(self, request: SynthesisRequest, *, is_takeover: bool) -> Admission | RequestRefused:
        """The request checked against the checkpoint, or why it cannot be served. A request taken over from a dead
        owner left the queue long ago: its queue deadline no longer applies."""
        checked = msgspec.structs.replace(request, deadline=None) if is_takeover else request
        try:
            return admit(checked, self.core.served, self.core.settings)
        except RequestRefused as exc:
            return exc

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

    async def _claim(self, request: SynthesisRequest) -> RequestClaim | None:
        """This replica's claim on a delivered request, or None when it is not ours to serve (it says why)."""
        core = self.core
        partition = subjects.partition_for(request.id, core.settings.num_partitions)

        async def still_open(_claim: OwnerClaim) -> bool:
            return not await has_ended(core.js, partition, request.id)

        resolved = await resolve_request_claim(core.kv, request.id, core.replica, may_take_over=still_open)
        owner, epoch = resolved.claim.record.replica, resolved.claim.record.epoch
        if resolved.kind is ClaimKind.LIVE_OWNER:
            log.info("request %s is owned by live replica %s (epoch %d); acking and skipping", request.id, owner,
                     epoch)
            return None
        if resolved.kind is ClaimKind.DEAD_OWNER_KEPT:
            log.info("request %s: its owner %s is dead but the request already ended; acking", request.id, owner)
            return None
        if resolved.kind is ClaimKind.OURS and (request.id in core.active
                                                or await has_ended(core.js, partition, request.id)):
            log.info("request %s redelivered while this replica serves it, or after it ended here; acking",
                     request.id)
            return None
        if resolved.previous is not None:
            log.warning("request %s: took it over (epoch %d) from %s, whose lease is dead", request.id, epoch,
                        resolved.previous.record.replica)
        return resolved

    async def _take_over(self, request: SynthesisRequest, admission: Admission | RequestRefused, epoch: int,
                         span: Span, *, is_new: bool) -> tuple[ActiveRequest, Resume] | None:
        """Read where the request stands in CODES, publish the TakeoverMarker fenced on it, register the request as
        owned here (`span` is its trace context). A stale owner that appended between the read and the marker makes
        the marker fail: read again. None when this replica had to stand down (it says why)."""
        core = self.core
        partition = subjects.partition_for(request.id, core.settings.num_partitions)
        for attempt in range(1, TAKEOVER_ATTEMPTS + 1):
            # A request nobody had claimed (ClaimKind.NEW) has nothing in CODES: its marker is fenced on an empty
            # subject without reading it first; were anything there, the marker is refused and the next attempt reads.
            fresh = is_new and attempt == 1
            resume = Resume.fresh() if fresh else await read_resume(core.js, partition, request.id)
            try:
                publisher = await CodesPublisher.take_over(
                    core.js, partition=partition, request_id=request.id, epoch=epoch, replica=core.replica,
                    last_sequence=resume.last_sequence, resume_frame=resume.num_frames, next_seq=resume.next_seq,
                    headers=inject(context=span_context(span)))
                break
            except OwnershipConflict as exc:
                log.warning("request %s: %s (attempt %d of %d)", request.id, exc, attempt, TAKEOVER_ATTEMPTS)
        else:
            log.error("request %s: its codes kept moving under epoch %d's takeover; standing down", request.id, epoch)
            core.capacity.release(request.priority)
            return None
        initial = request.initial_chunk_frames or self._first_chunk_frames(resume)
        stream = CodesStream(request.id, epoch, publisher, ChunkRule(initial, core.settings.chunk_frames),
                             next_seq=resume.next_seq, num_published_frames=resume.num_frames)
        input_tokens = admission.input_tokens if isinstance(admission, Admission) else 0
        active = ActiveRequest(request, stream, input_tokens=input_tokens, span=span)
        core.active.add(active)
        core.stats.requests_started += 1
        return active, resume

    def _first_chunk_frames(self, resume: Resume) -> int:
        """Frames in the first chunk of a request that names no size: one while this replica runs fewer requests
        than `one_frame_first_chunk_below`, else the setting's. A request taken over keeps the size its earlier
        owner chose, read from the chunks it published (the ramp after it follows from that size)."""
        settings = self.core.settings
        if resume.next_seq > 0:
            for initial in (1, settings.initial_chunk_frames):
                if ChunkRule(initial, settings.chunk_frames).frames_before(resume.next_seq) == resume.num_frames:
                    return initial
            return settings.initial_chunk_frames
        return 1 if len(self.core.active) < settings.one_frame_first_chunk_below else settings.initial_chunk_frames

    async def _read_cancel(self, request_id: str) -> CancelRecord | None:
        try:
            return await read_cancel(self.core.kv, request_id)
        except Exception:  # noqa: BLE001 - the cancel watcher still catches a cancel written later
            log.exception("request %s: could not read its cancel key; starting it", request_id)
            return None

    async def _start(self, active: ActiveRequest, admission: Admission, frames: np.ndarray, cancel_read: asyncio.Future,
                     prompt_kv: torch.Tensor | None = None) -> None:
        """Queue the request in the engine (continuing from `frames` its earlier owner emitted, if any), unless it
        was cancelled while it waited on REQUESTS."""
        core = self.core
        cancel = await cancel_read
        if cancel is not None:
            error = ErrorInfo(code=cancel.code, stage=Stage.GATEWAY, message=cancel.reason)
            await core.end(active, Ending(error=error))
            return
        if admission.request.clone is not None and core.voices is not None:
            try:  # the reference audio's work runs on its own thread (or comes from the cache)
                admission = await core.voices.attach(admission)
            except RequestRefused as exc:
                await core.end(active, Ending(error=ErrorInfo(code=exc.code, stage=Stage.DECODE, message=exc.message)))
                return
            if (voice := admission.prompt.voice) is not None and voice.ref_codes is not None:
                active.stream.context = voice.ref_codes.numpy()  # the vocoder primes its codec state with them
        try:
            # On the admission thread: the prompt is built while the engine thread steps.
            outcome, active.num_prompt_tokens = await self.admission.run(_add_to_engine, core.engine, admission,
                                                                         frames, prompt_kv)
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
        if outcome is not None:  # cannot fit the KV pool even alone (capacity), or migrated with every frame made
            await core.end_outcome(outcome)
            return
        if active.is_closed:  # cancelled while it was being queued: the abort came before the add
            await core.worker.run(core.engine.abort_request, admission.request_id)
            return
        core.wake()


def _add_to_engine(engine: Engine, admission: Admission, frames: np.ndarray,
                   prompt_kv: torch.Tensor | None = None) -> tuple[RequestOutcome | None, int]:
    """(On the engine thread.) Queue the request, continuing from `frames` (a migration, or a remote prefill's first
    frame with its prompt KV) when there are any; its immediate outcome if any, and its prompt length. A handed-over
    KV that does not fit this prompt (another block size, another checkpoint) is dropped: the prompt is prefilled
    here instead."""
    def add(kv: torch.Tensor | None) -> RequestOutcome | None:
        return engine.add_request(EngineRequest(
            admission.request_id, admission.prompt, admission.request.seed, admission.params,
            admission.max_new_frames, predictor_params=admission.predictor_params,
            ignore_eos=admission.request.ignore_eos, min_new_frames=admission.request.min_new_tokens,
            frames=torch.from_numpy(frames) if len(frames) else None, prompt_kv=kv,
            is_batch=admission.request.priority == "batch"))

    try:
        outcome = add(prompt_kv)
    except InvalidRequestError as exc:
        if prompt_kv is None:
            raise
        log.warning("request %s: the handed-over KV does not fit (%s); prefilling it here", admission.request_id, exc)
        outcome = add(None)
    return outcome, engine.num_prompt_tokens(admission.request_id) or 0


def _request_id_of(message: SynthesisRequest | PrefillHandoff) -> str:
    return message.request.id if isinstance(message, PrefillHandoff) else message.id


def _priority_of(message: SynthesisRequest | PrefillHandoff) -> str:
    return message.request.priority if isinstance(message, PrefillHandoff) else message.priority
