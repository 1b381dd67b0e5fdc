"""The replica's step endpoint: read and check each StepRequest on the event loop, queue it, compute the queue one
step at a time on the worker thread, answer each with its codes (or the error) and the replica's load.

The endpoint handler returns as soon as a step is queued, so the replica reads its next request at once: the load it
reports (steps and rows taken and not yet answered) is the real queue, not one hidden in the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.micro.request import Request

from messages import DecodeError, ErrorInfo, Stage, decode, encode
from messages.errors import ErrorCode
from messages.mtp import StepReply, StepRequest
from services.mtp.errors import StepRefused
from services.mtp.predictor import LoadedPredictor
from services.mtp.predictor_thread import PredictorWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Queued:
    request: Request
    step: StepRequest


class StepServer:
    """One replica's queue of steps and its counters (reported in `$SRV.STATS`)."""

    def __init__(self, predictor: LoadedPredictor, worker: PredictorWorker, replica: str, max_queued_steps: int) -> None:
        self._predictor = predictor
        self._worker = worker
        self.replica = replica
        self.max_queued_steps = max_queued_steps
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self.queued_steps = 0
        self.queued_rows = 0
        self.num_served = 0
        self.num_rows_served = 0
        self.refused: Counter[str] = Counter()
        self.compute_s = 0.0

    def stats(self) -> dict[str, Any]:
        return {"replica": self.replica, "fingerprint": self._predictor.fingerprint, "steps_served": self.num_served,
                "rows_served": self.num_rows_served, "steps_refused": dict(self.refused),
                "queued_steps": self.queued_steps, "queued_rows": self.queued_rows,
                "compute_s": round(self.compute_s, 6)}

    async def handle(self, request: Request) -> None:
        """The micro endpoint: a readable step this model can serve is queued; anything else is answered with an
        error naming the problem."""
        try:
            step = decode(request.data, StepRequest)
        except DecodeError as bad:
            await self._refuse(request, None, StepRefused(bad.code, f"unreadable StepRequest: {bad}"))
            return
        try:
            self._predictor.check(step)
            if self.queued_steps >= self.max_queued_steps:
                raise StepRefused(ErrorCode.QUEUE_FULL, f"{self.queued_steps} steps queued, the bound is "
                                                        f"{self.max_queued_steps}: send it to another replica")
        except StepRefused as refused:
            await self._refuse(request, step.step_id, refused)
            return
        self.queued_steps += 1
        self.queued_rows += step.num_rows
        self._queue.put_nowait(_Queued(request, step))

    async def run(self, halt: asyncio.Event) -> None:
        """Compute queued steps one at a time until `halt` is set and the queue is empty."""
        while not (halt.is_set() and self._queue.empty()):
            queued = await _next_or_none(self._queue, halt)
            if queued is not None:
                await self._serve(queued)
                self._queue.task_done()

    async def drain(self) -> None:
        """Answer every step already taken (no new one comes: the endpoint has stopped)."""
        await self._queue.join()

    async def _serve(self, queued: _Queued) -> None:
        step = queued.step
        started = time.perf_counter()
        try:
            codes = await self._worker.run(self._predictor.compute, step)
        except StepRefused as refused:
            self._unqueue(step)
            await self._refuse(queued.request, step.step_id, refused)
            return
        except Exception as exc:  # noqa: BLE001 - a failed step fails that step only; the replica keeps serving
            log.exception("mtp step %d (%d rows) failed", step.step_id, step.num_rows)
            self._unqueue(step)
            await self._refuse(queued.request, step.step_id,
                               StepRefused(ErrorCode.MODEL_ERROR, f"the code predictor raised {exc!r}"))
            return
        finally:
            self.compute_s += time.perf_counter() - started
        self._unqueue(step)
        self.num_served += 1
        self.num_rows_served += step.num_rows
        await self._respond(queued.request, StepReply(step_id=step.step_id, replica=self.replica,
                                                      queued_steps=self.queued_steps, queued_rows=self.queued_rows,
                                                      codes=codes))

    def _unqueue(self, step: StepRequest) -> None:
        self.queued_steps -= 1
        self.queued_rows -= step.num_rows

    async def _refuse(self, request: Request, step_id: int | None, refused: StepRefused) -> None:
        self.refused[str(refused.code)] += 1
        log.warning("mtp step %s refused (%s): %s", step_id, refused.code, refused)
        error = ErrorInfo(code=refused.code, stage=Stage.MTP, message=str(refused))
        await self._respond(request, StepReply(step_id=step_id, replica=self.replica, queued_steps=self.queued_steps,
                                               queued_rows=self.queued_rows, error=error))

    async def _respond(self, request: Request, reply: StepReply) -> None:
        """Answer; a step sent without a reply subject, or a reply the bus cannot take now, is the caller's loss
        (it resends on its timeout), never the replica's end."""
        try:
            await request.respond(encode(reply))
        except ValueError:  # nats-py: the request had no reply subject
            log.warning("mtp step %s came without a reply subject; not answered", reply.step_id)
        except nats.errors.Error as exc:
            log.warning("mtp step %s: reply not sent (%r); the caller resends on its timeout", reply.step_id, exc)


async def _next_or_none(queue: asyncio.Queue[_Queued], halt: asyncio.Event) -> _Queued | None:
    """The next queued step, or None once `halt` is set first."""
    getter = asyncio.ensure_future(queue.get())
    halted = asyncio.ensure_future(halt.wait())
    try:
        await asyncio.wait({getter, halted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halted.cancel()
    if getter.done():
        return getter.result()
    getter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await getter
    return None
