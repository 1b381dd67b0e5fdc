"""All codec work of the vocoder, on one worker thread, batched across requests.

The event loop never runs torch: callers `await decode(state, codes)`, the job joins a queue, and one batcher task
hands everything queued so far to the worker thread as one `decode_chunks` call. While the thread is busy, new jobs
pile up and go together in the next call, so batching grows with load without any waiting on purpose.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.vocoder.errors import CodecFailure, UndecodableCodes

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Job:
    state: Any
    codes: np.ndarray
    done: asyncio.Future = field(repr=False)


class CodecWorker:
    """Owns the codec decoder and the single thread that runs it.

    `decoder` is a `services.model.codec.CodecDecoder` (or anything with `new_stream`, `decode_chunk`, optionally
    `decode_chunks`, `config.codebook_size`, `config.num_quantizers`, `sample_rate`, `samples_per_frame`).
    """

    def __init__(self, decoder: Any, *, max_batch: int = 32, executor: ThreadPoolExecutor | None = None,
                 batch_across_requests: bool = True) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.decoder = decoder
        self.max_batch = max_batch
        # Off: each chunk is decoded alone (same kernels whatever the load, so a re-decode is bit-identical).
        self.batch_across_requests = batch_across_requests
        self.sample_rate: int = decoder.sample_rate
        self.samples_per_frame: int = decoder.samples_per_frame
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder-codec")
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._batcher: asyncio.Task | None = None
        self.num_calls = 0
        self.max_batch_seen = 0

    @classmethod
    async def load(cls, load_decoder: Callable[..., Any], *args: Any, max_batch: int = 32,
                   batch_across_requests: bool = True) -> CodecWorker:
        """Build the decoder with `load_decoder(*args)` on the worker's own thread (torch stays off the event
        loop, and a GPU context is made on the thread that will use it); the worker owns that thread."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder-codec")
        try:
            decoder = await asyncio.get_running_loop().run_in_executor(executor, load_decoder, *args)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        worker = cls(decoder, max_batch=max_batch, executor=executor, batch_across_requests=batch_across_requests)
        worker._owns_executor = True
        return worker

    async def run_on_thread(self, fn, *args):
        """Run any torch work (loading, a fresh stream) on the codec thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def new_stream(self) -> Any:
        """A fresh per-request codec state (allocated on the codec thread)."""
        return await self.run_on_thread(self.decoder.new_stream)

    async def decode(self, state: Any, codes: np.ndarray) -> np.ndarray:
        """Decode the next frames of one stream: int array [n, 16] -> float32 samples [n * samples_per_frame].

        Raises UndecodableCodes for codes of the wrong shape or out of the codebook's range (checked here, so one
        bad chunk never fails the other requests of its batch).
        """
        self._validate(codes)
        self._ensure_batcher()
        job = _Job(state, codes, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return await job.done

    def _validate(self, codes: np.ndarray) -> None:
        config = self.decoder.config
        if codes.ndim != 2 or codes.shape[1] != config.num_quantizers or codes.shape[0] == 0:
            raise UndecodableCodes(f"codes must have shape [n>0, {config.num_quantizers}], got {list(codes.shape)}")
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= config.codebook_size:
            raise UndecodableCodes(f"codes must lie in [0, {config.codebook_size}), got values in [{low}, {high}]")

    def _ensure_batcher(self) -> None:
        if self._batcher is None or self._batcher.done():
            # A fresh context: the batcher serves every request, so its log lines carry none of their ids.
            self._batcher = asyncio.get_running_loop().create_task(self._run_batches(), name="vocoder-codec-batcher",
                                                                   context=contextvars.Context())

    async def _run_batches(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            while len(jobs) < self.max_batch and not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            await self._run_batch(jobs)

    async def _run_batch(self, jobs: list[_Job]) -> None:
        self.num_calls += 1
        self.max_batch_seen = max(self.max_batch_seen, len(jobs))
        try:
            outputs = await self.run_on_thread(self._decode_on_thread, [j.state for j in jobs], [j.codes for j in jobs])
        except Exception as exc:  # a model error fails this batch's requests, never the batcher
            log.exception("codec call of %d chunks failed", len(jobs))
            failure = CodecFailure(f"the codec failed: {exc!r}")
            failure.__cause__ = exc
            outputs = [failure] * len(jobs)
        for job, output in zip(jobs, outputs):
            if job.done.cancelled():
                continue
            if isinstance(output, Exception):
                job.done.set_exception(output)
            else:
                job.done.set_result(output)

    def _decode_on_thread(self, states: list[Any], codes: list[np.ndarray]) -> list[np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(c, dtype=np.int64)) for c in codes]
        batched = getattr(self.decoder, "decode_chunks", None)
        if batched is not None and self.batch_across_requests and len(states) > 1:
            audio = batched(states, tensors)
        else:
            audio = [self.decoder.decode_chunk(s, t) for s, t in zip(states, tensors)]
        return [a.detach().to("cpu", torch.float32).numpy() for a in audio]

    async def close(self) -> None:
        """Stop the batcher (failing queued jobs) and the thread."""
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
            self._batcher = None
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.done.done():
                job.done.set_exception(asyncio.CancelledError())
        if self._owns_executor:
            self._executor.shutdown(wait=True)
