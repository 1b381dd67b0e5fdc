"""A long HTTP input spoken whole: split at sentence ends into ordered requests, their audio as one stream.

One request carries prompt and frames within decode's `max_model_len`, so a text of thousands of characters in one
request would be cut short. A text longer than the synthesizer's `segment_chars` is cut where the WebSocket cuts it
(requests/sentences.py), the sentences packed in order into segments of at most that many characters, and each
segment is one request, started in order with the next one already on the mesh while this one streams (the job
queue the WebSocket uses too, requests/job_queue.py). Their chunks form one stream, so the HTTP delivery (whole
file, bytes or SSE) is the same as for one request. The first segment runs under the HTTP request's id; segment k
under `<id>_k`. A shorter text is one request, exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import AsyncContextManager

import msgspec

from messages.base import Usage
from messages.events import Finished
from messages.frames import AudioChunk
from services.gateway.errors import GatewayError
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.body import SpeechBody
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.requests.job_queue import Job, JobQueue
from services.gateway.requests.sentences import CJK_TERMINATORS, SentenceSegmenter
from services.gateway.tenancy.tenant import Tenant

LOOKAHEAD = 2  # requests on the mesh at once for one HTTP input (the one streaming included), as a WebSocket's
CANCEL_REASON = "another segment of the same HTTP input failed"


def split_for_speech(text: str, max_chars: int) -> list[str]:
    """`text` itself when it has at most `max_chars` characters; else its sentences, in order, packed into segments
    of at most `max_chars` (a longer sentence is cut at a space, as the WebSocket cuts it)."""
    if len(text) <= max_chars:
        return [text]
    segmenter = SentenceSegmenter(max_chars)
    segments: list[str] = []
    for sentence in segmenter.append(text) + segmenter.flush():
        joiner = "" if segments and segments[-1][-1:] in CJK_TERMINATORS else " "
        if segments and len(segments[-1]) + len(joiner) + len(sentence) <= max_chars:
            segments[-1] += joiner + sentence
        else:
            segments.append(sentence)
    return segments or [text]  # nothing speakable: admission and decode say so for the text as a whole


def segment_id(request_id: str, index: int) -> str:
    """The request id of segment `index` of the HTTP request `request_id`."""
    return request_id if index == 0 else f"{request_id}_{index}"


class SegmentedStream:
    """The segments' audio as one stream, with the face the HTTP delivery reads from an AudioStream.

    Attributes:
        request_id: the first segment's id (the HTTP request's).
        terminal: once every segment finished, one Finished summing theirs (frames, chunks, audio, usage).
    """

    def __init__(self, queue: JobQueue, request_id: str) -> None:
        self.request_id = request_id
        self.terminal: Finished | None = None
        self._queue = queue
        self._finished: list[Finished] = []

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        """Every segment's chunks, segment after segment; GatewayError of the first segment that fails."""
        while (job := await self._queue.next()) is not None:
            stream = await job.opened()
            async for chunk in stream.chunks():
                yield chunk
            if isinstance(stream.terminal, Finished):
                self._finished.append(stream.terminal)
            self._queue.finished(job)
        self.terminal = _summed(self._finished)

    async def cancel_unfinished(self) -> None:
        """Cancel in the mesh every request of this input that is still running (one segment failed)."""
        for job in self._queue.jobs:
            await job.cancel()

    def release_all(self) -> None:
        """The response is done with every segment: their holders close their streams."""
        for job in self._queue.jobs:
            job.release()
        self._queue.remove_waiting()


@contextlib.asynccontextmanager
async def speech_stream(synthesizer: Synthesizer, body: SpeechBody, request_id: str | None,
                        tenant: Tenant | None = None) -> AsyncIterator[AudioStream | SegmentedStream]:
    """The audio of one `POST /v1/audio/speech` for `tenant`: one request, or the segments of a long input (see the
    module), which hold one admission under the tenant's limits between them. Raises GatewayError before yielding
    when the body is refused."""
    segments = split_for_speech(body.input, synthesizer.segment_chars)
    if len(segments) == 1:
        async with synthesizer.synthesize(body, request_id=request_id, tenant=tenant) as stream:
            yield stream
        return
    try:  # the whole body, once: a bad voice is a 400 before any segment reaches the mesh
        admitted = synthesizer.admission.admit(body, request_id=request_id, tenant=tenant)
    except GatewayError as error:
        synthesizer.metrics.refused(error)
        raise
    async with synthesizer.tenant_admission(tenant) if tenant is not None else contextlib.nullcontext():
        async with _segments(synthesizer, body, segments, admitted.id, tenant) as stream:
            yield stream


@contextlib.asynccontextmanager
async def _segments(synthesizer: Synthesizer, body: SpeechBody, segments: list[str], first_id: str,
                    tenant: Tenant | None) -> AsyncIterator[SegmentedStream]:
    failure: GatewayError | None = None
    async with asyncio.TaskGroup() as group:  # owns the segments' holder tasks
        queue = JobQueue(lambda work, name: group.create_task(work, name=name), lookahead=LOOKAHEAD,
                         max_jobs=len(segments))
        for index, text in enumerate(segments):
            fields = msgspec.structs.replace(body, input=text)
            queue.add(Job(_opener(synthesizer, fields, segment_id(first_id, index), tenant), _canceller(synthesizer),
                          audio_format=body.response_format, describe={"segment": index}))
        queue.end()
        stream = SegmentedStream(queue, first_id)
        try:
            yield stream
        except GatewayError as error:  # raised after the task group, not wrapped in an ExceptionGroup by it
            failure = error
            await stream.cancel_unfinished()
        finally:
            stream.release_all()
    if failure is not None:
        raise failure


def _opener(synthesizer: Synthesizer, fields: SpeechBody, request_id: str,
            tenant: Tenant | None) -> Callable[[], AsyncContextManager[AudioStream]]:
    return lambda: synthesizer.synthesize(fields, request_id=request_id, tenant=tenant, admitted=tenant is not None)


def _canceller(synthesizer: Synthesizer) -> Callable[[str], Awaitable[None]]:
    async def cancel(request_id: str) -> None:
        await synthesizer.supervisor.cancel(request_id, CANCEL_REASON)

    return cancel


def _summed(finished: list[Finished]) -> Finished | None:
    if not finished:
        return None
    usages = [end.usage for end in finished]
    usage = Usage(**{name: sum(getattr(u, name) for u in usages) for name in Usage.__struct_fields__})
    return msgspec.structs.replace(finished[-1], frames=sum(end.frames for end in finished),
                                   audio_seconds=sum(end.audio_seconds for end in finished),
                                   chunk_count=sum(end.chunk_count for end in finished), usage=usage)
