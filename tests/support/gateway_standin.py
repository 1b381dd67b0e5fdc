"""A test-only stand-in for decode + vocoder that speaks the real messages on the real NATS server.

It consumes REQUESTS with the bus's pull consumer, claims each request (owner CAS) and acks it, publishes real
AudioChunks on core NATS `tts.audio.<id>` following a scripted Plan (order, drops, failure), ends the request with
a real terminal event through the guard, answers RedecodeRequests by republishing chunks, and keeps real leases and
partition claims. The gateway under test cannot tell it from the real services; the real end-to-end test is the
lead's. The fixtures that use it are in tests/support/gateway_fixtures.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages import decode, encode, subjects
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.errors import ErrorCode, Stage
from messages.events import Failed, Finished
from messages.frames import AudioChunk
from messages.requests import RedecodeReply, RedecodeRequest, SynthesisRequest
from messages.streams import REQUESTS_STREAM, request_lanes, requests_consumer
from services.bus.claims import claim_partition, claim_request
from services.bus.laned_pull import LanedPull
from services.bus.leases import LeaseKeeper
from services.bus.pull_consumer import Capacity, Delivery, PullConsumer
from services.bus.terminal_guard import publish_terminal

MODEL = "tiny"
NUM_PARTITIONS = 2


@dataclass(frozen=True)
class Plan:
    """What the stand-in does with a request.

    Attributes:
        num_chunks: audio chunks of the request (seq 0..num_chunks-1), each `frames_per_chunk` frames long.
        order: publish order of the seqs (default 0, 1, 2...).
        drop: seqs left out of the first publish (a re-decode republishes them).
        fail_after: publish a Failed terminal after this many chunks (None: Finished after all).
        failure: (code, stage) of that Failed terminal.
        hang_after: publish this many chunks, then nothing more (no terminal): a stage that stopped.
        answer_redecode: whether RedecodeRequests are answered.
        consume: "ack" claims and serves; "nak" fails every delivery (poison); requests are left queued when the
            stand-in's consumer is not started.
    """

    num_chunks: int = 3
    frames_per_chunk: int = 2
    order: tuple[int, ...] | None = None
    drop: frozenset[int] = frozenset()
    fail_after: int | None = None
    failure: tuple[ErrorCode, Stage] = (ErrorCode.MODEL_ERROR, Stage.DECODE)
    hang_after: int | None = None
    answer_redecode: bool = True
    consume: str = "ack"


def chunk_value(seq: int) -> int:
    """The sample value every sample of chunk `seq` carries, so order and completeness are visible in the PCM."""
    return 100 * (seq + 1)


def expected_pcm(num_chunks: int, frames_per_chunk: int = 2) -> bytes:
    """The PCM a client must receive for chunks 0..num_chunks-1 in order."""
    return b"".join(_samples(seq, frames_per_chunk).tobytes() for seq in range(num_chunks))


def _samples(seq: int, frames_per_chunk: int) -> np.ndarray:
    return np.full(frames_per_chunk * SAMPLES_PER_FRAME, chunk_value(seq), dtype="<i2")


@dataclass
class StandInMesh:
    """Decode + vocoder, scripted. Set `plan` before a request; read what happened from the counters."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    plan: Plan = Plan()
    requests: list[SynthesisRequest] = field(default_factory=list)
    redecodes: list[RedecodeRequest] = field(default_factory=list)
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _lease_tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    _acked: asyncio.Condition = field(default_factory=asyncio.Condition)
    num_acked: int = 0

    async def start_replicas(self) -> None:
        """Live leases for a decode and a vocoder replica; the vocoder claims every partition."""
        for replica, service in (("decode-standin", "decode"), ("vocoder-standin", "vocoder")):
            keeper = LeaseKeeper(self.kv, replica, service, interval_s=0.1, ttl_s=0.5)
            await keeper.renew()
            self._lease_tasks[replica] = self._own(keeper.run(self._stop))
        for partition in range(NUM_PARTITIONS):
            await claim_partition(self.kv, partition, "vocoder-standin")
        await self.nc.subscribe(f"{subjects.REDECODE_ROOT}.*", cb=self._on_redecode)

    def start_consumer(self) -> None:
        """Begin pulling REQUESTS (leave it off to keep requests queued)."""
        capacity = Capacity(64)
        lanes = LanedPull(self.js, self.nc, stream=REQUESTS_STREAM, model=MODEL, lanes=request_lanes(MODEL),
                          capacity=capacity)
        consumer = PullConsumer(self.js, self.nc, stream=REQUESTS_STREAM, durable=requests_consumer(MODEL),
                                message_type=SynthesisRequest, handler=self._on_request, capacity=capacity,
                                fetch_timeout_s=0.2, source=lanes)
        self._own(consumer.run(self._stop))

    async def wait_acked(self, count: int) -> None:
        """Until `count` requests have been claimed and acked (taken off REQUESTS)."""
        async with self._acked:
            await self._acked.wait_for(lambda: self.num_acked >= count)

    def kill_vocoder(self) -> None:
        """The vocoder replica dies: its lease stops being renewed (and is not deleted), so it lapses."""
        self._lease_tasks.pop("vocoder-standin").cancel()

    async def stop(self) -> None:
        self._stop.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _own(self, coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _on_request(self, request: SynthesisRequest, delivery: Delivery) -> None:
        self.requests.append(request)
        if self.plan.consume == "nak":
            await delivery.nak(0.0)
            return
        await claim_request(self.kv, request.id, "decode-standin")
        await delivery.ack(confirmed=True)
        async with self._acked:
            self.num_acked += 1
            self._acked.notify_all()
        self._own(self._serve(request, self.plan))

    async def _serve(self, request: SynthesisRequest, plan: Plan) -> None:
        last = plan.num_chunks if plan.fail_after is None else plan.fail_after
        order = plan.order if plan.order is not None else tuple(range(plan.num_chunks))
        for seq in order:
            if seq < min(last, plan.hang_after if plan.hang_after is not None else last) and seq not in plan.drop:
                await self.publish_chunk(request.id, seq, plan)
        await self.nc.flush()
        if plan.hang_after is not None:
            return
        frames = last * plan.frames_per_chunk
        if plan.fail_after is None:
            event = Finished(request_id=request.id, at=time.time(), frames=frames, chunk_count=last,
                             audio_seconds=frames * SAMPLES_PER_FRAME / SAMPLE_RATE)
        else:
            code, stage = plan.failure
            event = Failed(request_id=request.id, at=time.time(), stage=stage, code=code, frames=frames,
                           chunk_count=last, reason=f"scripted failure after {last} chunks")
        await publish_terminal(self.js, request.id, event)

    async def publish_chunk(self, request_id: str, seq: int, plan: Plan) -> None:
        samples = _samples(seq, plan.frames_per_chunk)
        chunk = AudioChunk(request_id=request_id, seq=seq, first_sample=seq * samples.size, sample_rate=SAMPLE_RATE,
                           pcm=samples.tobytes())
        await self.nc.publish(subjects.audio(request_id), encode(chunk))

    async def _on_redecode(self, msg: Msg) -> None:
        request = decode(msg.data, RedecodeRequest)
        self.redecodes.append(request)
        if not self.plan.answer_redecode:
            await msg.respond(encode(RedecodeReply(request_id=request.request_id, accepted=False,
                                                   reason="scripted refusal")))
            return
        await msg.respond(encode(RedecodeReply(request_id=request.request_id, accepted=True)))
        last = self.plan.num_chunks if self.plan.fail_after is None else self.plan.fail_after
        for seq in range(request.from_seq, last):
            await self.publish_chunk(request.request_id, seq, self.plan)
