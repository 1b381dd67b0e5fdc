"""Decode's side of the mtp topology: `RemotePredictor` sends a step's rows to the least-loaded live mtp replica and
returns codebooks 1..15, resending the same step to another replica when one times out, has gone, or fails.

The engine calls `predict_rest` (or `submit`) from its own thread; the NATS work runs on the service's event loop
(`asyncio.run_coroutine_threadsafe`). Every attempt of a step publishes the same StepRequest (same step_id) with its own
reply subject `<inbox>.<step_id>.<attempt>`, so the first good answer of any attempt completes the step, and a reply
for a step that already completed (a slow replica's, after a resend) is ignored, its load noted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from messages import DecodeError, decode, encode, subjects
from messages.errors import ErrorCode, InvalidConfig
from messages.mtp import StepReply, StepRequest
from services.bus.provision import open_bucket
from services.model.sampling import SamplingParams
from services.mtp.errors import MtpClientError, NoMtpReplicas, RemoteStepFailed, StepRejected
from services.mtp.lease_follower import LeaseFollower
from services.mtp.replica_set import ReplicaSet
from services.mtp.step_rows import codes_tensor, pack_step

log = logging.getLogger(__name__)

NO_RESPONDERS = "503"  # the server's status when nobody listens on a request's subject (the replica is gone)
_STATUS_HEADER = "Status"
REFUSALS = (ErrorCode.BAD_MESSAGE, ErrorCode.INVALID_REQUEST)
"""Error codes that blame the step itself: no other replica would take it either."""


@dataclass(slots=True)
class _Attempt:
    replica: str
    settled: bool = False


@dataclass(slots=True)
class _Step:
    """A step in flight: its attempts, and what came back for them (replies, no-responder notices)."""

    request: StepRequest
    attempts: list[_Attempt] = field(default_factory=list)
    outcomes: asyncio.Queue[tuple[int, StepReply | None]] = field(default_factory=asyncio.Queue)
    """(attempt index, the reply, or None: nobody listened)."""


class PendingStep:
    """A step sent from the engine thread: `result()` blocks until its codes are back."""

    def __init__(self, future: concurrent.futures.Future[np.ndarray], device: torch.device) -> None:
        self._future = future
        self._device = device

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> torch.Tensor:
        """Codebooks 1..15, int64 [B, 15], on the device of the hidden states; raises the step's MtpClientError."""
        return codes_tensor(self._future.result(), self._device)


class RemotePredictor:
    """The code predictor behind NATS: the client of the `mtp` replicas.

    Start it on the loop (`await start()` or `await wait_for_replicas()`), call `predict_rest` from the engine thread,
    `await close()` on the loop at the end.
    """

    def __init__(self, nc: Client, loop: asyncio.AbstractEventLoop, fingerprint: str, *, timeout_s: float,
                 attempts: int) -> None:
        if not timeout_s > 0:
            raise InvalidConfig(f"mtp timeout_s must be > 0, got {timeout_s}")
        if attempts < 1:
            raise InvalidConfig(f"mtp attempts must be >= 1, got {attempts}")
        self.nc = nc
        self._loop = loop
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.replicas = ReplicaSet()
        self._steps: dict[int, _Step] = {}
        self._step_ids = itertools.count()  # next() is atomic under the GIL: any thread may take an id
        self._inbox = nc.new_inbox()
        self._subscription = None
        self._follower: LeaseFollower | None = None
        self.num_late_replies = 0

    # --- on the event loop ------------------------------------------------------------------------------------
    async def start(self, kv: KeyValue | None = None) -> None:
        """Listen for replies and follow the mtp replicas' leases (`kv`: the bucket, opened here when None)."""
        if self._follower is not None:
            return
        self._subscription = await self.nc.subscribe(subjects.mtp_replies(self._inbox), cb=self._on_reply)
        self._follower = LeaseFollower(kv if kv is not None else await open_bucket(self.nc.jetstream()),
                                       self.replicas)
        await self._follower.start()

    async def close(self) -> None:
        """Stop following leases and listening for replies (steps still in flight fail as timed out)."""
        if self._follower is not None:
            await self._follower.stop()
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def wait_for_replicas(self, count: int = 1, timeout_s: float = 60.0) -> None:
        """Return once `count` mtp replicas are live; NoMtpReplicas after `timeout_s`."""
        await self.start()
        try:
            await asyncio.wait_for(self._follower.wait_until(lambda: len(self.replicas.live()) >= count), timeout_s)
        except asyncio.TimeoutError:
            raise NoMtpReplicas(f"{len(self.replicas.live())} live mtp replica(s) after {timeout_s:.0f}s, waited "
                                f"for {count}: start `voxmesh serve mtp` (same checkpoint as decode)") from None

    async def step(self, request: StepRequest) -> np.ndarray:
        """Run one step to its codes (int64 [B, 15]): up to `attempts` replicas, each given `timeout_s`."""
        if self._follower is None:
            raise MtpClientError("RemotePredictor.start() was not awaited: no replica is known")
        if request.step_id in self._steps:
            raise MtpClientError(f"mtp step {request.step_id} is already in flight: step ids must be unique")
        state = _Step(request)
        self._steps[request.step_id] = state
        reasons: list[str] = []
        try:
            payload = encode(request)
            if len(payload) > self.nc.max_payload:
                raise MtpClientError(f"mtp step {request.step_id}: {request.num_rows} rows make {len(payload)} bytes, "
                                     f"over the server's {self.nc.max_payload}-byte message limit: send fewer rows "
                                     f"per step (or raise max_payload)")
            for index in range(self.attempts):
                replica = self.replicas.choose({a.replica for a in state.attempts})
                if replica is None:
                    raise RemoteStepFailed(request.step_id, _tried(state, reasons), "no live mtp replica left to try")
                state.attempts.append(_Attempt(replica))
                reasons.append("no reply")
                self.replicas.sent(replica, request.num_rows)
                await self.nc.publish(subjects.mtp_step(replica), payload,
                                       reply=subjects.mtp_reply(self._inbox, request.step_id, index))
                codes = await self._await_attempt(state, index, reasons)
                if codes is not None:
                    return codes
            raise RemoteStepFailed(request.step_id, _tried(state, reasons), f"all {self.attempts} attempts failed")
        finally:
            del self._steps[request.step_id]
            for attempt in state.attempts:
                self._settle(attempt, request.num_rows)

    async def _await_attempt(self, state: _Step, index: int, reasons: list[str]) -> np.ndarray | None:
        """Wait up to `timeout_s` for attempt `index`: its codes, or None when it failed (the next attempt goes
        out). A good reply to an earlier attempt that comes meanwhile completes the step too."""
        deadline = self._loop.time() + self.timeout_s
        while True:
            try:
                which, reply = await asyncio.wait_for(state.outcomes.get(), deadline - self._loop.time())
            except asyncio.TimeoutError:
                reasons[index] = f"no reply within {self.timeout_s:g}s"
                self.replicas.failed(state.attempts[index].replica, unresponsive=True)
                return None
            attempt = state.attempts[which]
            self._settle(attempt, state.request.num_rows)
            if reply is None:
                reasons[which] = "no responders (gone)"
                self.replicas.failed(attempt.replica, unresponsive=True)
            elif reply.error is None:
                return reply.rows()
            else:
                self._refused(state.request, attempt.replica, reply)
                reasons[which] = f"{reply.error.code}: {reply.error.message}"
            if which == index:
                return None

    def _refused(self, request: StepRequest, replica: str, reply: StepReply) -> None:
        error = reply.error
        self.replicas.failed(replica, unresponsive=False)
        if error.code in REFUSALS:
            raise StepRejected(request.step_id, replica, error.code, error.message)
        if error.code == ErrorCode.FINGERPRINT_MISMATCH:
            log.error("mtp replica %s serves other weights: %s", replica, error.message)
            self.replicas.incompatible(replica, error.message)

    def _settle(self, attempt: _Attempt, rows: int) -> None:
        if not attempt.settled:
            attempt.settled = True
            self.replicas.settled(attempt.replica, rows)

    async def _on_reply(self, msg: Msg) -> None:
        address = subjects.mtp_reply_address(msg.subject)
        gone = bool(msg.headers) and msg.headers.get(_STATUS_HEADER) == NO_RESPONDERS
        reply = None
        if not gone:
            try:
                reply = decode(msg.data, StepReply)
            except DecodeError as bad:
                log.error("unreadable mtp reply on %s: %s", msg.subject, bad)
                return  # the attempt times out and the step goes to another replica
            self.replicas.reported(reply)
        step_id, index = address if address is not None else (None, 0)
        state = self._steps.get(step_id) if step_id is not None else None
        if state is None or index >= len(state.attempts) or (reply is not None and reply.step_id not in (None, step_id)):
            self.num_late_replies += 1  # a step that completed already (or never was ours)
            return
        state.outcomes.put_nowait((index, reply))

    # --- on the engine thread ---------------------------------------------------------------------------------
    def submit(self, hidden: torch.Tensor, c0: torch.Tensor, seeds: Sequence[int], frames: Sequence[int],
               params: Sequence[SamplingParams]) -> PendingStep:
        """Send a step without waiting (the engine may overlap other work); `.result()` gives its codes."""
        self._refuse_loop_thread()
        request = pack_step(self.fingerprint, next(self._step_ids), hidden, c0, seeds, frames, params)
        return PendingStep(asyncio.run_coroutine_threadsafe(self.step(request), self._loop), hidden.device)

    def predict_rest(self, hidden: torch.Tensor, c0: torch.Tensor, seeds: list[int], frames: list[int],
                     params: list[SamplingParams]) -> torch.Tensor:
        """Blocking (engine thread): codebooks 1..15, int64 [B, 15] on hidden's device, as `model_ops.predict_rest`
        computes them locally with `RowSampling.build(params, seeds, frames)`. Raises RemoteStepFailed (naming the
        replicas tried) when every attempt failed, StepRejected when a replica refused the step itself."""
        return self.submit(hidden, c0, seeds, frames, params).result()

    def stats(self) -> dict:
        """Per replica: live, sent, answered, failed, in flight, last reported load (read it on the loop)."""
        return {"replicas": self.replicas.stats(), "late_replies": self.num_late_replies}

    def _refuse_loop_thread(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._loop:
            raise MtpClientError("RemotePredictor.predict_rest blocks: call it from the engine thread, not the event "
                                 "loop (there, await step())")


def _tried(state: _Step, reasons: list[str]) -> list[tuple[str, str]]:
    return [(attempt.replica, reason) for attempt, reason in zip(state.attempts, reasons)]
