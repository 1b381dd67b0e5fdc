"""One WebSocket session of `/v1/audio/speech/stream` (the messages are in ws/protocol.py).

A receiver and a player run in one TaskGroup. The receiver validates each client message (a bad one gets an `error`
event and the socket stays open; an oversized one closes the socket with 1009), cuts incremental text into
sentences and queues one job per segment. The player streams the jobs' audio strictly in order while the next job
is already on the mesh. When the client leaves, requests whose `audio.start` it saw are parked for the resume
window; requests it never heard of are cancelled at once, since nobody can resume them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode
from services.gateway.errors import GatewayError, RequestFailed
from services.gateway.http.encoders import StreamEncoder, stream_encoder
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.body import SynthesisFields
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.tenancy.tenant import Tenant
from services.gateway.ws.channel import ClientChannel
from services.gateway.requests.job_queue import Job, JobQueue
from services.gateway.ws.orphan_resume import adopt_orphan
from services.gateway.ws.protocol import (BINARY_FORMAT, AudioDone, AudioStart, Cancel, InputDone, InputFlush,
                                          InputText, Resume, SessionConfig, SessionDone, SessionUpdate,
                                          SessionUpdated, parse_client_message, response_format_of)
from services.gateway.ws.resume import ParkedRequest, ResumeRefused, ResumeRegistry, resumed_stream
from services.gateway.ws.resume_token import ResumeTokens
from services.gateway.requests.sentences import SentenceSegmenter
from services.gateway.voices.ws_messages import VOICE_MESSAGE_BYTES, carries_ref_audio, echoed

log = logging.getLogger(__name__)

MESSAGE_TOO_BIG = 1009
CLIENT_CANCEL_REASON = "cancelled by the client"
_INVALID = ErrorCode.INVALID_REQUEST
_INPUT_CLOSED = ErrorCode.INPUT_CLOSED


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-socket limits.

    Attributes:
        max_message_bytes: a larger client message closes the socket with 1009 (unless it carries ref_audio).
        lookahead: requests on the mesh at once per socket (the one streaming included).
        max_jobs: segments and requests that may wait on one socket.
    """

    max_message_bytes: int = 64 * 1024
    max_voice_message_bytes: int = VOICE_MESSAGE_BYTES
    """A message carrying `ref_audio` (session.update or a one-shot request) may be this large."""
    lookahead: int = 2
    max_jobs: int = 64


class ClientGone(Exception):
    """The client closed the socket (or the session closed it)."""


class SessionOver(Exception):
    """`session.done` was sent: the session ends normally."""


class SpeechSession:
    """Serves one accepted WebSocket until the client leaves or finishes its input."""

    def __init__(self, websocket: WebSocket, synthesizer: Synthesizer, registry: ResumeRegistry,
                 tokens: ResumeTokens, limits: SessionLimits = SessionLimits(), *,
                 tenant: Tenant | None = None) -> None:
        self._ws = websocket
        self._tenant = tenant  # the key the socket authenticated with: its requests' limits and tenant
        self._tokens = tokens
        self._synthesizer = synthesizer
        self._registry = registry
        self._limits = limits
        self._config = SessionConfig()
        self._segmenter = SentenceSegmenter(synthesizer.admission.max_text_chars)
        self._queue: JobQueue | None = None
        self._channel = ClientChannel(websocket)
        self._is_input_done = False
        self._num_segments = 0
        self._delivered: list[str] = []
        self._samples_delivered = 0
        self._left_at: float | None = None

    async def run(self) -> None:
        """Until the client disconnects, or its input is done and every segment served."""
        try:
            async with asyncio.TaskGroup() as group:
                self._queue = JobQueue(lambda work, name: group.create_task(work, name=name),
                                       lookahead=self._limits.lookahead, max_jobs=self._limits.max_jobs)
                group.create_task(self._receive(), name="ws-receive")
                group.create_task(self._play(), name="ws-play")
        except* SessionOver:
            with contextlib.suppress(Exception):
                await self._channel.close(1000)
        except* (ClientGone, WebSocketDisconnect, OSError):  # OSError: a send to a socket already gone
            log.debug("websocket client left")
        finally:
            await self._leave()

    # The receiver.

    async def _receive(self) -> None:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                self._left_at = time.time()
                raise ClientGone()
            text, data = message.get("text"), message.get("bytes")
            size = len(text.encode()) if text is not None else len(data or b"")
            if size > self._limits.max_message_bytes and not (
                    size <= self._limits.max_voice_message_bytes and text is not None and carries_ref_audio(text)):
                await self._close_oversized(size)
            if text is None:
                await self._channel.error(GatewayError(ErrorCode.BINARY_FRAME, "a binary frame: this protocol "
                                                       "takes JSON text messages; send the message as text"))
                continue
            try:
                await self._handle(parse_client_message(text))
            except GatewayError as error:
                await self._channel.error(error)

    async def _close_oversized(self, size: int) -> None:
        """An `error` event names the limit (a close reason is cut at 123 bytes), then close 1009."""
        self._left_at = time.time()
        limit = self._limits.max_message_bytes
        await self._channel.error(GatewayError(ErrorCode.MESSAGE_TOO_BIG, f"a message of {size} bytes is over the "
                                               f"{limit}-byte limit; the socket closes (1009): send text in "
                                               "several input.text messages"))
        await self._channel.close(MESSAGE_TOO_BIG, f"message of {size} bytes is over the {limit}-byte limit")
        raise ClientGone()

    async def _handle(self, message: Any) -> None:
        if isinstance(message, SynthesisFields):  # a one-shot request
            self._synthesizer.admission.admit(message, tenant=self._tenant)  # refused here: nothing queued
            self._add(self._job(lambda: self._synthesizer.synthesize(message, tenant=self._tenant), BINARY_FORMAT))
        elif isinstance(message, SessionUpdate):
            config = self._config.updated(message)
            fields = config.fields_for("check")
            self._synthesizer.admission.admit(fields, tenant=self._tenant)  # voice, language, priority: refused now
            if fields.ref_audio is not None:  # read and stored now, so a bad reference is refused now
                await self._synthesizer.check_voice(fields)
            self._config = config
            await self._channel.event(SessionUpdated(session=echoed(config)))
        elif isinstance(message, (InputText, InputFlush, InputDone)):
            self._take_text(message)
        elif isinstance(message, Cancel):
            await self._cancel(message.request_id)
        elif isinstance(message, Resume):
            self._add(self._resume_job(message))

    def _take_text(self, message: InputText | InputFlush | InputDone) -> None:
        if self._is_input_done:
            raise GatewayError(_INPUT_CLOSED, "input.done was sent: this session takes no more text; open a new "
                                              "socket")
        if isinstance(message, InputText):
            segments = self._segmenter.append(message.text)
        else:
            segments = self._segmenter.flush()
        for text in segments:
            self._add(self._segment_job(text))
        if isinstance(message, InputDone):
            self._is_input_done = True
            self._jobs().end()

    def _segment_job(self, text: str) -> Job:
        fields = self._config.fields_for(text)
        index, self._num_segments = self._num_segments, self._num_segments + 1
        return self._job(lambda: self._synthesizer.synthesize(fields, tenant=self._tenant), self._config.format,
                         self._config.served_rate(), describe={"segment": index, "text": text})

    def _resume_job(self, message: Resume) -> Job:
        from_seq = 0 if message.last_seq is None else message.last_seq + 1
        rate = self._config.served_rate()
        # Resampled audio depends on all the audio before it: the chunks the client had are replayed through the
        # resampler (not sent), so the rest are the bytes the first stream would have sent (see _forward).
        replay_from = from_seq if rate == SAMPLE_RATE else 0

        @contextlib.asynccontextmanager
        async def open_stream() -> AsyncIterator[AudioStream]:
            parked: ParkedRequest | None = None
            entered = False
            try:
                self._tokens.check(message.request_id, message.resume_token)
                try:
                    parked = await self._registry.claim(message.request_id, message.last_seq)
                except ResumeRefused:  # not streamed here: perhaps its own gateway died
                    parked = await adopt_orphan(self._synthesizer, self._registry, message.request_id,
                                                message.last_seq)
                    if parked is None:
                        raise
                async with resumed_stream(self._synthesizer, self._registry, parked, replay_from) as stream:
                    entered = True
                    yield stream
            except GatewayError as error:
                if parked is not None and not entered and not isinstance(error, ResumeRefused):
                    self._registry.park(parked)  # a bus hiccup: the client may try again within the window
                error.request_id = message.request_id
                raise

        return self._job(open_stream, self._config.format, rate, first_seq=from_seq, describe={"resumed": True})

    def _job(self, open_stream, audio_format: str, sample_rate: int = SAMPLE_RATE, **options: Any) -> Job:
        return Job(open_stream, self._cancel_in_mesh, audio_format=audio_format, sample_rate=sample_rate, **options)

    def _add(self, job: Job) -> None:
        if self._is_input_done:
            raise GatewayError(_INPUT_CLOSED, "input.done was sent: this session takes no more requests; open a "
                                              "new socket")
        self._jobs().add(job)

    async def _cancel(self, request_id: str | None) -> None:
        """Cancel one request of this socket, or everything (buffered text included)."""
        queue = self._jobs()
        if request_id is None:
            self._segmenter.clear()
            targets = queue.jobs
        else:
            targets = [job for job in queue.jobs if job.stream is not None and job.stream.request_id == request_id]
            if not targets:
                raise GatewayError(_INVALID, f"no request {request_id} streams on this socket", param="request_id")
        for job in targets:
            job.is_cancelled = True
        queue.remove_waiting(keep=lambda job: not job.is_cancelled)
        for job in targets:
            await job.cancel()

    async def _cancel_in_mesh(self, request_id: str) -> None:
        if await self._synthesizer.supervisor.cancel(request_id, CLIENT_CANCEL_REASON):
            log.info("request %s cancelled by its client", request_id)

    # The player.

    async def _play(self) -> None:
        queue = self._jobs()
        while (job := await queue.next()) is not None:
            await self._play_job(job)
            queue.finished(job)  # not on cancellation: _leave still sees the job being played
        await self._channel.event(SessionDone(request_ids=self._delivered, segments=self._num_segments,
                                     samples=self._samples_delivered,
                                     duration_s=self._samples_delivered / SAMPLE_RATE))
        raise SessionOver()

    async def _play_job(self, job: Job) -> None:
        try:
            stream = await job.opened()
        except GatewayError as error:
            if not job.is_cancelled:
                await self._channel.error(error)
            return
        if job.is_cancelled:
            return  # cancelled before the client heard of it (the holder cancels it in the mesh)
        self._registry.attach(stream.request_id)
        await self._channel.event(AudioStart(request_id=stream.request_id, format=job.audio_format,
                                    sample_rate=job.sample_rate, first_seq=job.first_seq,
                                    resume_token=self._tokens.issue(stream.request_id), **job.describe))
        job.is_announced = True
        try:
            samples, sample_rate = await self._forward(job, stream)
        except RequestFailed as error:
            error.request_id = stream.request_id
            self._registry.detach(stream.request_id)
            await self._channel.error(error)
            return
        self._registry.detach(stream.request_id)
        if job.is_cancelled:
            await self._channel.error(GatewayError(ErrorCode.CANCELLED, f"{CLIENT_CANCEL_REASON}; the request had "
                                                f"ended already, {job.next_seq} chunks were sent"))
            return
        terminal = stream.terminal
        await self._channel.event(AudioDone(request_id=stream.request_id, chunk_count=stream.next_seq, samples=samples,
                                   duration_s=samples / sample_rate, frames=getattr(terminal, "frames", None),
                                   stop=getattr(terminal, "stop", None)))
        self._delivered.append(stream.request_id)
        self._samples_delivered += samples

    async def _forward(self, job: Job, stream: AudioStream) -> tuple[int, int]:
        """Send the stream's chunks from `job.first_seq` until its end (none once the client cancelled), in the
        job's format and rate; (model samples sent, their rate). Chunks before `first_seq` (a resumed stream of
        resampled audio replays them) only go through the encoder, so its state is the first stream's."""
        samples, sample_rate = 0, SAMPLE_RATE
        encoder: StreamEncoder | None = None
        is_resampled = False
        last_seq = 0
        async for chunk in stream.chunks():
            if job.is_cancelled:
                continue  # silence at once; the mesh's terminal follows the cancel
            if encoder is None:
                encoder = stream_encoder(response_format_of(job.audio_format), chunk.sample_rate, job.sample_rate)
                is_resampled = chunk.sample_rate != job.sample_rate
            data = encoder.feed(chunk.pcm)
            last_seq = chunk.seq
            if chunk.seq < job.first_seq:
                continue
            await self._channel.audio(job.audio_format, stream.request_id, chunk.seq, data)
            job.next_seq = chunk.seq + 1
            samples += chunk.num_samples
            sample_rate = chunk.sample_rate
        if encoder is not None and is_resampled and not job.is_cancelled:
            # The resampling filter's tail (the request's last few ms): one more frame, numbered as the last chunk.
            await self._channel.audio(job.audio_format, stream.request_id, last_seq, encoder.finish())
        return samples, sample_rate

    # Leaving.

    async def _leave(self) -> None:
        """Park what the client may resume; cancel what it never heard of."""
        if self._queue is None:
            return
        seen_gone_at = self._left_at if self._left_at is not None else time.time()
        for job in self._queue.jobs:
            stream = job.stream
            if stream is None:
                continue
            if job.is_announced and not job.is_cancelled:
                # The supervisor's instant when it watches the request, so its window and the registry's are one.
                left_at = self._synthesizer.supervisor.client_left_at(stream.request_id)
                self._registry.park(ParkedRequest(stream.request_id, stream.partition, sent=job.next_seq,
                                                  received=stream.contiguous_chunks(),
                                                  left_at=seen_gone_at if left_at is None else left_at))
                continue
            try:
                await self._cancel_in_mesh(stream.request_id)
            except Exception:  # noqa: BLE001 - the supervisor still cancels it after the window
                log.exception("could not cancel request %s of a closed socket", stream.request_id)

    def _jobs(self) -> JobQueue:
        if self._queue is None:
            raise RuntimeError("the session is not running")
        return self._queue
