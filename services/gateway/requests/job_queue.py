"""Ordered synthesis work whose audio must reach the client in order: a WebSocket session's, and a long HTTP input's
segments (http/segmented_speech.py).

A job is one request's audio: a text segment, a one-shot request, or a resumed request. Its request is started (put
on the mesh) by a holder task that keeps the request's AudioStream open until the session has played it; the
session plays jobs strictly in order, while the next `lookahead - 1` jobs are already started, so the mesh works on
the next sentence while this one streams. Requests are submitted in job order (each holder waits for the previous
job's submission), so the mesh sees the sentences in the order they were written.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, AsyncContextManager

from messages.errors import ErrorCode
from services.gateway.errors import GatewayError
from services.gateway.requests.audio_stream import AudioStream

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task]
StreamOpener = Callable[[], AsyncContextManager[AudioStream]]
CancelRequest = Callable[[str], Awaitable[object]]


class Job:
    """One request's audio for the client.

    Attributes:
        describe: what `audio.start` says besides the request id (segment, text, resumed...).
        audio_format: how its audio is sent.
        sample_rate: the rate it is sent at (None: the format's own).
        first_seq: the first chunk the client gets (0, or last_seq+1 on resume).
        next_seq: the chunk after the last one sent to the client.
        is_announced: its `audio.start` was sent (the client knows its request id).
        is_cancelled: the client cancelled it.
    """

    def __init__(self, open_stream: StreamOpener, cancel_request: CancelRequest, *, audio_format: str,
                 sample_rate: int | None = None, first_seq: int = 0, describe: dict[str, Any] | None = None) -> None:
        self._open_stream = open_stream
        self._cancel_request = cancel_request
        self.audio_format = audio_format
        self.sample_rate = sample_rate
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.describe = describe or {}
        self.is_announced = False
        self.is_cancelled = False
        self._ready: asyncio.Future[AudioStream] = asyncio.get_running_loop().create_future()
        self._ready.add_done_callback(_mark_retrieved)  # a refusal is reported by the player, or by nobody
        self._released = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def is_started(self) -> bool:
        return self._task is not None

    @property
    def stream(self) -> AudioStream | None:
        """Its AudioStream once the request is on the mesh (None before, or when it could not start)."""
        if self._ready.done() and not self._ready.cancelled() and self._ready.exception() is None:
            return self._ready.result()
        return None

    def start(self, spawn: Spawn, after: Job | None) -> None:
        """Start the holder task (submits once `after` has submitted)."""
        self._task = spawn(self._hold(after), "ws-job")

    async def opened(self) -> AudioStream:
        """The stream, once the request is on the mesh; raises the GatewayError that kept it off."""
        return await asyncio.shield(self._ready)

    async def wait_submitted(self) -> None:
        """Until this job's request was submitted or refused."""
        await asyncio.wait([self._ready])

    async def cancel(self) -> None:
        """The client cancelled: stop the request in the mesh now if it is there, else as soon as it is."""
        self.is_cancelled = True
        if (stream := self.stream) is not None:
            await self._cancel_request(stream.request_id)

    def release(self) -> None:
        """The session is done with the stream: the holder closes it (and the request's supervision goes on)."""
        self._released.set()

    async def _hold(self, after: Job | None) -> None:
        try:
            if after is not None:
                await after.wait_submitted()
            if self._released.is_set():
                raise GatewayError(ErrorCode.CANCELLED, "cancelled before the request was submitted")
            async with self._open_stream() as stream:
                self._ready.set_result(stream)
                if self.is_cancelled:  # cancelled while it was being submitted
                    await self._cancel_request(stream.request_id)
                await self._released.wait()
        except GatewayError as error:
            self._fail(error)
        except Exception as exc:  # noqa: BLE001 - one request's bug fails that request, not the session
            log.exception("starting a request failed")
            self._fail(GatewayError(ErrorCode.INTERNAL, f"the gateway could not start the request: {exc!r}"))
        finally:
            self._fail(GatewayError(ErrorCode.INTERNAL, "the session ended before the request was submitted"))

    def _fail(self, error: GatewayError) -> None:
        if not self._ready.done():
            self._ready.set_exception(error)


def _mark_retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class JobQueue:
    """Jobs in play order, started `lookahead` at a time (the playing one included)."""

    def __init__(self, spawn: Spawn, *, lookahead: int = 2, max_jobs: int = 64) -> None:
        if lookahead < 1 or max_jobs < 1:
            raise ValueError(f"lookahead and max_jobs must be >= 1, got {lookahead}, {max_jobs}")
        self._spawn = spawn
        self.lookahead = lookahead
        self.max_jobs = max_jobs
        self._jobs: deque[Job | None] = deque()  # None: the end of input
        self._playing: Job | None = None
        self._last_started: Job | None = None
        self._changed = asyncio.Event()

    @property
    def jobs(self) -> list[Job]:
        """The playing job and the waiting ones."""
        waiting = [job for job in self._jobs if job is not None]
        return ([self._playing] if self._playing is not None else []) + waiting

    def add(self, job: Job) -> None:
        """Queue `job` to play after the others; GatewayError when too many wait."""
        if sum(job is not None for job in self._jobs) >= self.max_jobs:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"{self.max_jobs} segments already wait on this socket; "
                               "send more text once audio has been received")
        self._jobs.append(job)
        self._start_ready()
        self._changed.set()

    def end(self) -> None:
        """No job comes after the ones queued."""
        self._jobs.append(None)
        self._changed.set()

    async def next(self) -> Job | None:
        """The next job to play (started), or None at the end of input."""
        while not self._jobs:
            self._changed.clear()
            await self._changed.wait()
        job = self._jobs.popleft()
        self._playing = job
        self._start_ready()
        return job

    def finished(self, job: Job) -> None:
        """The session has played `job`."""
        job.release()
        if self._playing is job:
            self._playing = None
        self._start_ready()

    def remove_waiting(self, keep: Callable[[Job], bool] = lambda job: False) -> list[Job]:
        """Take out the waiting jobs that `keep` refuses (all by default); returns them, released."""
        removed = [job for job in self._jobs if job is not None and not keep(job)]
        self._jobs = deque(job for job in self._jobs if job is None or keep(job))
        for job in removed:
            job.release()
        self._start_ready()
        return removed

    def _start_ready(self) -> None:
        playing = [self._playing] if self._playing is not None else []
        for job in (playing + [job for job in self._jobs if job is not None])[: self.lookahead]:
            if not job.is_started:
                job.start(self._spawn, self._last_started)
                self._last_started = job
