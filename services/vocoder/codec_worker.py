"""All codec work of the vocoder, on one worker thread, batched across requests, each request's state in a slot.

The event loop never runs torch: callers `await decode(stream, codes)`, the job joins a queue, and one batcher task
hands everything queued so far to the worker thread as one `SlotDecoder.decode_chunks` call. While the thread is
busy, new jobs pile up and go together in the next call, so batching grows with load; and when it is free, a chunk
whose listener still has audio in hand waits a few milliseconds for others (`max_hold_s`), where a first chunk never
waits.
A call runs its shortest chunks' passes first and hands each chunk's audio back as its pass ends: a request's first
packet (its first chunk is its shortest) does not wait for the call's 8-frame passes. With `urgent_passes`, a chunk
whose listener has (almost) nothing in hand, a first chunk above all, gets a pass of its own ahead of the others even
where padding it into theirs would cost less.

Each request holds a `CodecStream` (a slot of the decoder's state pool) from `new_stream()` until `release()`.
Slots are taken and given back on the codec thread, in order with the decode calls, and a job of a released
stream is dropped before it reaches the thread: so a slot is never reused while a call that wrote it is pending.

An in-context clone's reference frames are decoded on a second thread, the priming thread, into a state of their
own (never a request's slot), which the stream's first job copies into its slot on the codec thread: the other
streams' calls go on meanwhile. Primed states are kept by the frames' content for the next request of that voice.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.metrics.timings import Timings, snapshots
from services.model.codec.primed_voices import PrimedVoices
from services.model.codec.slot_decoder import SlotDecoder
from services.model.codec.slot_pool import SlotSnapshot
from services.model.codec.slot_pool import SlotsExhausted
from services.vocoder.errors import CodecFailure, UndecodableCodes

log = logging.getLogger(__name__)

DEFAULT_PRIMED_VOICES = 32
"""Primed reference states a vocoder keeps (a few MB of device memory each for the released codec)."""

DEFAULT_MAX_HOLD_S = 0.010
"""The longest a chunk with audio in hand waits for others to share its codec call: about one decode step at a full
batch, so that the chunks two steps finish go in one pass."""

HOLD_MARGIN_S = 0.100
"""Audio a chunk's listener must still have in hand for the chunk to wait at all: its own call, the relay and the
network come out of it."""


class CodecStream:
    """One request's hold on a codec state slot, from `CodecWorker.new_stream()` until `release()`."""

    __slots__ = ("slot", "is_released", "_worker")

    def __init__(self, slot: int, worker: CodecWorker) -> None:
        self.slot = slot
        self.is_released = False
        self._worker = worker

    def release(self) -> None:
        """Give the slot back (idempotent); decodes of this stream still queued fail with CodecFailure."""
        self._worker.release(self)

    def __repr__(self) -> str:
        return f"CodecStream(slot={self.slot}, released={self.is_released})"


@dataclass(slots=True)
class _Job:
    stream: CodecStream
    codes: np.ndarray
    """The frames to voice."""
    primed: SlotSnapshot | None
    """A state to put in the stream's slot before its frames (an in-context clone's reference decoded), or None."""
    done: asyncio.Future = field(repr=False)
    hold_until: float = 0.0
    """The event loop's time until which the job may wait for others to share its call (0: none, it goes at once)."""
    urgent: bool = False
    """Its listener has (almost) nothing in hand: with `urgent_passes`, it goes in a pass of its own, first."""


class CodecWorker:
    """Owns the slot decoder and the single thread that runs it.

    The pool holds `slots.max_streams` streams: the caller bounds its concurrent streams by that (the vocoder sizes
    it as max_streams + max_redecodes); one past it gets SlotsExhausted.
    """

    def __init__(self, slots: SlotDecoder, *, max_batch: int = 32, executor: ThreadPoolExecutor | None = None,
                 batch_across_requests: bool = True, primed_voices: int = DEFAULT_PRIMED_VOICES,
                 max_hold_s: float = DEFAULT_MAX_HOLD_S, urgent_passes: bool = False) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not max_hold_s >= 0:
            raise ValueError(f"max_hold_s must be >= 0, got {max_hold_s}")
        self.max_hold_s = max_hold_s if batch_across_requests else 0.0  # alone, a chunk gains nothing by waiting
        self.urgent_passes = urgent_passes
        self.primed = PrimedVoices(primed_voices)
        """Codec states primed with a reference's frames, by the frames' content (used on the priming thread only)."""
        self._primer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder-prime")
        """Primes voices beside the codec thread, so no other stream's chunk waits for a priming."""
        self.num_voices_primed = 0
        self.num_voices_reused = 0
        self.slots = slots
        self.decoder = slots.decoder
        self.max_batch = max_batch
        # Off: each chunk is decoded alone (same kernels whatever the load, so a re-decode is bit-identical).
        self.batch_across_requests = batch_across_requests
        self.sample_rate: int = self.decoder.sample_rate
        self.samples_per_frame: int = self.decoder.samples_per_frame
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder-codec")
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._batcher: asyncio.Task | None = None
        self._closed = False
        self.num_calls = 0
        self.max_batch_seen = 0
        self.timings = {"call": Timings(), "chunk": Timings(), "prime": Timings()}
        """Wall times of one batched call on the codec thread, of one chunk from `decode()` to its audio (the
        queue behind the call in progress included): what a chunk, a first packet's included, waits for here; and
        of priming a stream with a reference's frames on the priming thread (or finding the state kept)."""

    @classmethod
    async def load(cls, load_decoder: Callable[..., Any], *args: Any, max_streams: int, max_batch: int = 32,
                   batch_across_requests: bool = True, capture: bool | None = None,
                   primed_voices: int = DEFAULT_PRIMED_VOICES, primes_voices: bool = True,
                   max_hold_s: float = DEFAULT_MAX_HOLD_S, urgent_passes: bool = False) -> CodecWorker:
        """Build the decoder with `load_decoder(*args)` and its slot decoder on the worker's own thread (torch stays
        off the event loop, and a GPU context is made on the thread that will use it), and build (on CUDA: capture)
        every step shape before returning, so the first requests are as fast as the rest; with `primes_voices`,
        also every priming pass of a cloned voice's reference (a checkpoint that clones none can leave them)."""
        max_rows = max_batch if batch_across_requests else 1

        def build() -> SlotDecoder:
            decoder = load_decoder(*args)
            if decoder.device.type == "cuda":
                # The codec thread works on a stream of its own (torch streams do not wait for the default one),
                # so in a process that also decodes, codec and talker graphs can overlap on the card.
                torch.cuda.set_stream(torch.cuda.Stream(decoder.device))
            slots = SlotDecoder(decoder, max_streams=max_streams, max_rows=max_rows, capture=capture)
            slots.warm_up(priming=primes_voices)
            return slots

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder-codec")
        try:
            slots = await asyncio.get_running_loop().run_in_executor(executor, build)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        worker = cls(slots, max_batch=max_batch, executor=executor, batch_across_requests=batch_across_requests,
                     primed_voices=primed_voices, max_hold_s=max_hold_s, urgent_passes=urgent_passes)
        worker._owns_executor = True
        return worker

    def graph_status(self) -> dict[str, int]:
        """Step shapes replayed as CUDA graphs, and those whose capture failed (they run eagerly)."""
        return {"codec_graphs": self.slots.num_graphs, "codec_capture_failures": len(self.slots.capture_failures)}

    async def run_on_thread(self, fn, *args):
        """Run any torch work on the codec thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def new_stream(self) -> CodecStream:
        """A slot holding a fresh per-request state (taken on the codec thread).

        Cancelled while the slot is being taken, the slot goes back as soon as it is taken. SlotsExhausted when
        every slot is held: a caller that admitted more streams than the pool holds.
        """
        taking = asyncio.get_running_loop().run_in_executor(self._executor, self.slots.acquire)
        try:
            slot = await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(self._release_untaken)
            raise
        except SlotsExhausted as exc:
            raise SlotsExhausted(exc.code, f"{exc}; this vocoder holds {self.slots.max_streams} (its max_streams "
                                           "plus max_redecodes): a request was admitted past the bound") from exc
        return CodecStream(slot, self)

    def _release_untaken(self, taking: asyncio.Future) -> None:
        if not taking.cancelled() and taking.exception() is None:
            self.release(CodecStream(taking.result(), self))

    def release(self, stream: CodecStream) -> None:
        """Give a stream's slot back, on the codec thread after every call already handed to it (idempotent)."""
        if stream.is_released:
            return
        stream.is_released = True
        if not self._closed:
            self._executor.submit(self.slots.release, stream.slot).add_done_callback(_log_release_error)

    async def decode(self, stream: CodecStream, codes: np.ndarray, context: np.ndarray | None = None, *,
                     audio_in_hand_s: float = 0.0) -> np.ndarray:
        """Decode the next frames of one stream: int array [n, 16] -> float32 samples [n * samples_per_frame].

        `audio_in_hand_s`: how much of the stream's audio its listener has yet to play. A chunk with more than
        `HOLD_MARGIN_S` in hand may wait, when the codec thread is free, up to `max_hold_s` for other chunks to share
        its call; one without (a first chunk) goes in the next call whatever it holds.

        `context` ([m, 16], or None) is decoded into the stream's state first and not voiced: the codec's history
        then holds it, as a decode of context + codes would (an in-context clone's reference frames). That priming
        runs on a thread of its own, one forward over the frames (or none: frames primed before and still kept),
        while the codec thread serves the other streams; its state is copied into the stream's slot just before
        `codes` are decoded.
        Raises UndecodableCodes for codes of the wrong shape or out of the codebook's range (checked here, so one
        bad chunk never fails the other requests of its batch), CodecFailure when the stream was released first.
        """
        self._validate(codes)
        if context is not None:
            self._validate(context)
        if stream.is_released:
            raise CodecFailure(f"{stream} was released: its request ended")
        primed = None
        if context is not None:
            primed = await asyncio.get_running_loop().run_in_executor(self._primer, self._primed_state, context)
            if stream.is_released:
                raise CodecFailure(f"{stream} was released: its request ended")
        self._ensure_batcher()
        loop = asyncio.get_running_loop()
        may_wait_s = min(self.max_hold_s, audio_in_hand_s - HOLD_MARGIN_S)
        job = _Job(stream, codes, primed, loop.create_future(), loop.time() + may_wait_s if may_wait_s > 0 else 0.0,
                   urgent=self.urgent_passes and audio_in_hand_s <= HOLD_MARGIN_S)
        started = time.perf_counter()
        self._queue.put_nowait(job)
        audio = await job.done
        self.timings["chunk"].observe(time.perf_counter() - started)
        return audio


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
            self._take_queued(jobs)
            await self._wait_for_company(jobs)
            await self._run_batch(jobs)

    def _take_queued(self, jobs: list[_Job]) -> None:
        while len(jobs) < self.max_batch and not self._queue.empty():
            jobs.append(self._queue.get_nowait())

    async def _wait_for_company(self, jobs: list[_Job]) -> None:
        """While every job taken may still wait and the call is not full, take the jobs that come meanwhile.

        A pass has a fixed cost in launches whatever it holds, then a little per row: a free codec thread that runs
        each chunk as it comes runs many small passes (and each is a switch of the card to this process), where
        chunks that still have audio in hand can wait a few milliseconds and go in one. A job that may not wait (a
        first chunk) ends the wait as soon as it is taken, and goes with everything taken so far."""
        loop = asyncio.get_running_loop()
        while len(jobs) < self.max_batch:
            left = min(job.hold_until for job in jobs) - loop.time()
            if left <= 0:
                return
            try:
                jobs.append(await asyncio.wait_for(self._queue.get(), left))
            except TimeoutError:
                return
            self._take_queued(jobs)

    async def _run_batch(self, jobs: list[_Job]) -> None:
        # No await between here and the hand-off: a stream released later is released after this call on the thread.
        released = [j for j in jobs if j.stream.is_released]
        _settle(released, [CodecFailure(f"{j.stream} was released: its request ended") for j in released])
        jobs = [j for j in jobs if not j.stream.is_released]
        if not jobs:
            return
        self.max_batch_seen = max(self.max_batch_seen, len(jobs))
        loop = asyncio.get_running_loop()

        def ready(entries: list[int], audio: list[np.ndarray]) -> None:  # on the codec thread, as passes finish
            loop.call_soon_threadsafe(_settle, [jobs[entry] for entry in entries], audio)

        started = time.perf_counter()
        try:
            outputs = await self.run_on_thread(self._decode_on_thread, [j.stream.slot for j in jobs],
                                               [j.codes for j in jobs], [j.primed for j in jobs], ready,
                                               [j.urgent for j in jobs])
        except Exception as exc:  # a model error fails this batch's requests, never the batcher
            log.exception("codec call of %d chunks failed", len(jobs))
            failure = CodecFailure(f"the codec failed: {exc!r}")
            failure.__cause__ = exc
            outputs = [failure] * len(jobs)
        finally:
            # Counted with its time, once it returned: its chunks may have been settled (and their audio sent)
            # before, as their passes ended, so a call is never counted without its time.
            self.num_calls += 1
            self.timings["call"].observe(time.perf_counter() - started)
        _settle(jobs, outputs)

    def _decode_on_thread(self, slots: list[int], codes: list[np.ndarray], primed: list[SlotSnapshot | None],
                          ready: Callable[[list[int], list[np.ndarray]], None],
                          urgent: list[bool]) -> list[np.ndarray]:
        """One call's chunks; `ready` hears of each chunk's audio as soon as its pass is done (short chunks, first
        packets among them, come first), the return value has them all once every pass is."""
        for slot, state in zip(slots, primed):
            if state is not None:
                self.slots.restore(slot, state)
        tensors = [torch.from_numpy(np.ascontiguousarray(c, dtype=np.int64)) for c in codes]

        def on_ready(entries: list[int], audio: list[torch.Tensor], offset: int = 0) -> None:
            ready([offset + entry for entry in entries], [samples.numpy() for samples in audio])

        if self.batch_across_requests:
            audio = self.slots.decode_chunks(slots, tensors, to_host=True, on_ready=on_ready, urgent=urgent)
        else:
            audio = [self.slots.decode_chunks([s], [t], to_host=True,
                                              on_ready=functools.partial(on_ready, offset=index))[0]
                     for index, (s, t) in enumerate(zip(slots, tensors))]
        return [a.numpy() for a in audio]

    def _primed_state(self, context: np.ndarray) -> SlotSnapshot:
        """(On the priming thread.) The state `context` primes: a kept one of the same frames, or a priming's, then
        kept."""
        started = time.perf_counter()
        key = self.primed.key(context)
        state = self.primed.get(key)
        if state is not None:
            self.num_voices_reused += 1
        else:
            state = self.slots.primed_state(torch.from_numpy(np.ascontiguousarray(context, dtype=np.int64)))
            self.primed.put(key, state)
            self.num_voices_primed += 1
        self.timings["prime"].observe(time.perf_counter() - started)
        return state

    def pass_status(self) -> dict[str, int]:
        """The codec's passes and how full they ran (for STATS): frames decoded against rows x frames run."""
        return {"codec_passes": self.slots.num_passes, "codec_row_frames": self.slots.num_row_frames,
                "codec_padded_row_frames": self.slots.num_padded_row_frames}

    def primed_status(self) -> dict[str, int]:
        """Primings, states reused, and what the kept ones hold (for STATS)."""
        return {"codec_voices_primed": self.num_voices_primed, "codec_voices_reused": self.num_voices_reused,
                "codec_voices_kept": len(self.primed), "codec_voices_kept_bytes": self.primed.num_bytes}

    async def close(self) -> None:
        """Stop the batcher (failing queued jobs) and the thread."""
        self._closed = True
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
            self._batcher = None
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.done.done():
                job.done.set_exception(asyncio.CancelledError())
        self._primer.shutdown(wait=True, cancel_futures=True)
        if self._owns_executor:
            self._executor.shutdown(wait=True)


def _settle(jobs: list[_Job], outputs: list[np.ndarray | Exception]) -> None:
    for job, output in zip(jobs, outputs):
        if job.done.done():  # cancelled: its request no longer waits
            continue
        if isinstance(output, Exception):
            job.done.set_exception(output)
        else:
            job.done.set_result(output)


def _log_release_error(done: Future) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("giving a codec slot back failed: %r", done.exception())
