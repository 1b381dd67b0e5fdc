"""One request's bus operations, in the order the request path makes them, each timed, through the product's own
functions: the gateway's submit, decode's delivery of it, its claim, its read of the cancel key, a lifecycle event
published as decode's `emit` does (awaiting the stream's ack: decode awaits `Started`, beside the cancel read, before
the engine gets the request), the fenced codes appends and their delivery to the vocoder's consumer, one audio
chunk's delivery on core NATS per codes chunk, and the terminal event."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages import encode, subjects
from messages.events import Finished, Started, event_subject
from messages.frames import AudioChunk, CodesChunk, CodesEnd
from messages.requests import SynthesisRequest
from messages.streams import CODES_STREAM, REQUESTS_STREAM, codes_consumer, consumer_for
from services.bus.claims import resolve_request_claim
from services.bus.codes_publisher import CodesPublisher
from services.bus.kvstore import read_cancel
from services.bus.provision import open_bucket
from services.bus.submit import submit_request
from services.bus.terminal_guard import publish_terminal

MODEL = "tiny"
PARTITION = 0  # every bench request's codes in one partition: one vocoder consumer answers them all
REQUESTS_CONSUMER = consumer_for(MODEL, "interactive", "")  # the lane a keyless interactive request is queued in
CHUNK_FRAMES = (2, 2, 4, 8)  # decode's default ramp (initial 2, doubling up to 8): a short request's chunks
SAMPLES_PER_FRAME = 1920  # 24 kHz / 12.5 frames per second
DELIVERY_TIMEOUT_S = 10.0
T = TypeVar("T")

OPS = ("submit", "request_delivery", "claim", "cancel_read", "event", "codes_append_first", "codes_append", "codes_delivery",
       "terminal", "audio_delivery")
"""What one request times. codes_append_first is chunk 0's append (the one before the first packet); codes_append
every append (chunks and the CodesEnd). *_delivery: from the publish's start until the consumer has the message."""


@dataclass
class RequestPath:
    """The connections and bindings one bus's requests go through: a publishing client (gateway, decode), the
    decode and vocoder pull consumers, and an audio subscriber on `audio_nc` (another member on a cluster)."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    requests: object  # nats-py JetStreamContext.PullSubscription
    codes: object
    audio_nc: Client
    audio_inbox: dict[str, asyncio.Future[float]]

    @classmethod
    async def open(cls, nc: Client, audio_nc: Client) -> RequestPath:
        js = nc.jetstream()
        kv = await open_bucket(js)
        requests = await js.pull_subscribe_bind(REQUESTS_CONSUMER, REQUESTS_STREAM)
        codes = await js.pull_subscribe_bind(codes_consumer(PARTITION), CODES_STREAM)
        path = cls(nc, js, kv, requests, codes, audio_nc, {})
        await audio_nc.subscribe(f"{subjects.AUDIO_ROOT}.*", cb=path._on_audio)
        await audio_nc.flush()
        return path

    async def _on_audio(self, msg: Msg) -> None:
        waiter = self.audio_inbox.pop(msg.subject, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(time.perf_counter())

    async def close(self) -> None:
        for subscription in (self.requests, self.codes):
            await subscription.unsubscribe()


async def timed(samples: dict[str, list[float]], op: str, call: Awaitable[T]) -> T:
    """`await call`, adding its duration in milliseconds to samples[op]."""
    start = time.perf_counter()
    result = await call
    samples.setdefault(op, []).append((time.perf_counter() - start) * 1000.0)
    return result


async def _delivered(subscription, start: float, samples: dict[str, list[float]], op: str,
                     fetch: asyncio.Task) -> Msg:
    messages = await fetch
    samples.setdefault(op, []).append((time.perf_counter() - start) * 1000.0)
    return messages[0]


async def one_request(path: RequestPath, samples: dict[str, list[float]], rng: np.random.Generator) -> None:
    """Make one request's bus operations on `path`, adding each one's milliseconds to `samples`."""
    request_id = f"opb-{uuid.uuid4().hex[:16]}"
    request = SynthesisRequest(id=request_id, model=MODEL, text="A bench request.", created_at=time.time())
    fetch = asyncio.create_task(path.requests.fetch(1, timeout=DELIVERY_TIMEOUT_S))
    await asyncio.sleep(0)  # let the fetch's pull request go out first, as a waiting decode's is
    start = time.perf_counter()
    await timed(samples, "submit", submit_request(path.js, request))
    delivery = await _delivered(path.requests, start, samples, "request_delivery", fetch)
    claim = await timed(samples, "claim", resolve_request_claim(path.kv, request_id, "bench-decode"))
    await delivery.ack()  # decode's intake acks without waiting for the server's confirmation
    await timed(samples, "cancel_read", read_cancel(path.kv, request_id))  # decode reads it beside the event below
    started = Started(request_id=request_id, at=time.time(), replica="bench-decode", epoch=claim.claim.record.epoch)
    await timed(samples, "event", path.js.publish(event_subject(started), encode(started)))
    publisher = CodesPublisher(path.js, partition=PARTITION, request_id=request_id, epoch=claim.claim.record.epoch)
    first_frame = 0
    for seq, frames in enumerate(CHUNK_FRAMES):
        chunk = CodesChunk.from_frames(request_id=request_id, seq=seq, first_frame=first_frame,
                                       epoch=publisher.epoch, frames=rng.integers(0, 2048, (frames, 16)))
        first_frame += frames
        fetch = asyncio.create_task(path.codes.fetch(1, timeout=DELIVERY_TIMEOUT_S))
        await asyncio.sleep(0)
        start = time.perf_counter()
        await timed(samples, "codes_append_first" if seq == 0 else "codes_append", publisher.publish(chunk))
        if seq == 0:
            samples.setdefault("codes_append", []).append(samples["codes_append_first"][-1])
        codes = await _delivered(path.codes, start, samples, "codes_delivery", fetch)
        await codes.ack()
        await _audio_delivery(path, samples, chunk)
    end = CodesEnd(request_id=request_id, seq=len(CHUNK_FRAMES), epoch=publisher.epoch, reason="finished",
                   total_frames=first_frame, stop="length")
    await timed(samples, "codes_append", publisher.publish(end))
    finished = Finished(request_id=request_id, at=time.time(), frames=first_frame,
                        audio_seconds=first_frame / 12.5, chunk_count=len(CHUNK_FRAMES), stop="length")
    if not await timed(samples, "terminal", publish_terminal(path.js, request_id, finished)):
        raise RuntimeError(f"{request_id}: the terminal guard refused the only terminal event")


async def _audio_delivery(path: RequestPath, samples: dict[str, list[float]], chunk: CodesChunk) -> None:
    """One audio chunk of `chunk`'s length on core NATS, from the publishing client to the audio subscriber."""
    subject = subjects.audio(chunk.request_id)
    audio = AudioChunk(request_id=chunk.request_id, seq=chunk.seq, first_sample=chunk.first_frame * SAMPLES_PER_FRAME,
                       sample_rate=24000, pcm=bytes(2 * SAMPLES_PER_FRAME * chunk.num_frames))
    arrived: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    path.audio_inbox[subject] = arrived
    start = time.perf_counter()
    await path.nc.publish(subject, encode(audio))
    end = await asyncio.wait_for(arrived, DELIVERY_TIMEOUT_S)
    samples.setdefault("audio_delivery", []).append((end - start) * 1000.0)
