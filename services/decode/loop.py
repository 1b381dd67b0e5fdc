"""The frame loop: `engine.step()` on the engine thread, then publish what it produced, request by request.

Step N+1 runs while step N's codes are being published (the engine thread and the event loop overlap); each
request's messages still go out in order, because a step's publishing finishes before the next step's starts and
every request publishes under its own lock. With `--steps-queued 2` (the default) the next step call is already in
the engine thread's queue when a step returns, so that thread goes from one step to the next without waiting for the
event loop to hand it the call; a step's outputs are still published in order, all of them, also when the loop stops.
The publishing itself waits out the engine thread's launch of the next step (`LaunchTurns`), so the two do not
share the interpreter lock while the step's critical path runs on the host.

A model run that raises is isolated by the engine (only the request that makes it raise ends, `step_failed` ->
`model_error`); should `step()` itself raise, the requests it was running fail (`model_error`) and the loop serves
on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque

from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.events import FirstFrame, Preempted, Resumed
from services.bus.logs import request_context
from services.decode.active import ActiveRequest
from services.decode.core import DecodeCore, Ending, ending_of
from services.engine.outputs import FrameOutput, StepOutput
from services.engine.sequence import FailureCode, RequestOutcome

log = logging.getLogger(__name__)


class FrameLoop:
    """Runs engine steps while there is work, and turns their outputs into codes, events and ends."""

    def __init__(self, core: DecodeCore, steps_queued: int = 1) -> None:
        if steps_queued < 1:
            raise ValueError(f"steps_queued must be >= 1, got {steps_queued}")
        self.core = core
        self.steps_queued = steps_queued

    async def run(self, stop: asyncio.Event) -> None:
        """Step until `stop` is set; idle (no thread work) while the engine has nothing to run."""
        core = self.core
        queued: deque[asyncio.Future] = deque()  # step calls handed to the engine thread, oldest first
        publishing: asyncio.Task | None = None
        try:
            while not stop.is_set():
                if not queued and not self._has_work():
                    if publishing is not None:
                        await publishing
                        publishing = None
                    await self._idle(stop)
                    continue
                # Read while a queued step may be running: a stale "work" costs one empty step, a stale "none"
                # only delays queueing the next call to the next turn.
                while len(queued) < self.steps_queued and (not queued or self._has_work()):
                    queued.append(asyncio.ensure_future(core.worker.run(core.engine.step)))
                if publishing is not None:
                    await publishing
                    publishing = None
                publishing = self._published(await self._await_step(queued.popleft()))
        finally:
            if publishing is not None:
                await publishing
            while queued:  # steps already handed over: their frames are someone's audio, so they go out too
                publishing = self._published(await self._await_step(queued.popleft()))
                if publishing is not None:
                    await publishing

    def _published(self, output: StepOutput | None) -> asyncio.Task | None:
        return asyncio.create_task(self.publish(output)) if output is not None else None

    def _has_work(self) -> bool:
        engine = self.core.engine
        return engine.has_unfinished() and not engine.is_draining

    async def _idle(self, stop: asyncio.Event) -> None:
        core = self.core
        core.work.clear()
        if self._has_work():
            return
        waits = [asyncio.ensure_future(core.work.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _await_step(self, step: asyncio.Future) -> StepOutput | None:
        try:
            return await step
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, never the replica
            log.exception("engine step failed")
            self.core.stats.step_errors += 1
            await self._fail_all(f"the decode model raised during a step ({type(exc).__name__}: {exc}); retry "
                                 "the request, and report it if it repeats")
            return None

    async def _fail_all(self, message: str) -> None:
        core = self.core
        error = ErrorInfo(code=ErrorCode.MODEL_ERROR, stage=Stage.DECODE, message=message)
        for active in core.active.all():
            await core.worker.run(core.engine.abort_request, active.request_id)
            await core.end(active, Ending(error=error))

    async def publish(self, output: StepOutput) -> None:
        """Publish one step's frames, events and ends; requests in parallel, each in order.

        Most requests of a step only add a frame that completes no chunk: that is done here, inline, and only the
        requests with something to send (a full chunk, an end, an event) get a coroutine of their own; at 64
        requests a step, one task each cost the event loop more than the publishing did."""
        core = self.core
        await core.turns.launched()  # the next step's launch first: it is on the critical path, this is not
        core.stats.record_step(len(output.frames))
        core.stats.preemptions += len(output.preempted_ids)
        frames: dict[str, list[FrameOutput]] = defaultdict(list)
        for frame in output.frames:
            frames[frame.request_id].append(frame)
        outcomes = {outcome.request_id: outcome for outcome in output.outcomes}
        preempted = set(output.preempted_ids)
        work = []
        for rid in set(frames) | set(outcomes) | preempted:
            active = core.active.get(rid)
            if active is None:
                continue
            own, outcome, was_preempted = frames.get(rid, []), outcomes.get(rid), rid in preempted
            try:
                if outcome is None and not was_preempted and self._only_adds(active, own):
                    continue
            except Exception as exc:  # noqa: BLE001 - as in the full path: this request fails, not the loop
                work.append(self._publishing_failed(active, exc))
                continue
            work.append(self._publish_guarded(active, own, outcome, was_preempted))
        await asyncio.gather(*work)
        core.capacity.nudge()  # a step may have freed KV blocks: the intake may pull again

    def _only_adds(self, active: ActiveRequest, frames: list[FrameOutput]) -> bool:
        """Queue `frames` of a request that then has nothing to send (no chunk filled, no event due): True when
        done here; False (nothing queued) when it needs the full path."""
        if not frames or active.is_closed or active.is_preempted or frames[0].index == 0:
            return False
        stream = active.stream
        if stream.num_pending_frames + len(frames) >= stream.rule.size(stream.next_seq):
            return False
        for frame in frames:
            stream.add_frame(frame.index, frame.codes.numpy())
        return True

    async def _publish_guarded(self, active: ActiveRequest, frames: list[FrameOutput],
                               outcome: RequestOutcome | None, was_preempted: bool) -> None:
        """One request's share of a step; a bug in it fails that request (`internal`), not the loop."""
        try:
            await self._publish_request(active, frames, outcome, was_preempted)
        except Exception as exc:  # noqa: BLE001
            await self._publishing_failed(active, exc)

    async def _publishing_failed(self, active: ActiveRequest, exc: Exception) -> None:
        with request_context(active.request_id):
            log.error("request %s: publishing a step's output failed", active.request_id, exc_info=exc)
            await self.core.worker.run(self.core.engine.abort_request, active.request_id)
            message = f"decode failed while publishing this request's codes ({type(exc).__name__}: {exc})"
            await self.core.end(active, Ending(error=ErrorInfo(code=ErrorCode.INTERNAL, stage=Stage.DECODE,
                                                                message=message)))

    async def _publish_request(self, active: ActiveRequest, frames: list[FrameOutput],
                               outcome: RequestOutcome | None, was_preempted: bool) -> None:
        core = self.core
        arrived = core.now()  # FirstFrame's time: when the frame was here, not when its events' turn came
        with request_context(active.request_id):
            if active.is_closed:
                return
            for frame in frames:
                active.stream.add_frame(frame.index, frame.codes.numpy())
            if outcome is not None and outcome.code == FailureCode.PREEMPTED:
                core.stats.preemptions += 1
                await self._preempted_event(active)
            if outcome is not None:
                await core.end(active, ending_of(outcome))
            else:
                await core.flush(active)  # codes first: they are the first packet's latency, events are not
            if frames:
                await self._frame_events(active, frames[0], arrived)
            if was_preempted:
                active.is_preempted = True
                await self._preempted_event(active)

    async def _preempted_event(self, active: ActiveRequest, cause: str = "capacity") -> None:
        core = self.core
        await core.emit(Preempted(request_id=active.request_id, at=core.now(), replica=core.replica,
                                  frames_done=active.stream.num_frames, cause=cause))

    async def _frame_events(self, active: ActiveRequest, first: FrameOutput, arrived: float) -> None:
        core = self.core
        if first.index == 0:
            await core.emit(FirstFrame(request_id=active.request_id, at=arrived, replica=core.replica))
        if active.is_preempted:
            active.is_preempted = False
            await core.emit(Resumed(request_id=active.request_id, at=core.now(), replica=core.replica,
                                    frames_done=first.index))

