"""One level of the synthetic load: N streams on one bus for a bounded time, through the real subjects.

Roles as in a mesh, each on its own connection (on a cluster, each on another member: decode on member 1, the
vocoder on member 2, the gateway on member 3):
- decode: each stream submits a request (REQUESTS), claims it (the bucket), appends its codes chunks with
  `CodesPublisher` (fenced, as decode does) at 12.5 frames per second, then its CodesEnd and the terminal event,
  and starts its next request;
- vocoder: pulls each partition's codes with `PromptPull` (as the vocoder does), acks them, and publishes one audio
  chunk per codes chunk on `tts.audio.<id>` (core NATS) of the size the vocoder would;
- gateway: subscribes to `tts.audio.>`.
Each codes append carries its start time in a header, passed on with its audio, so the gateway's side measures the
whole bus path of a chunk (append, delivery to the vocoder, audio to the gateway) without the model.
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
import uuid
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg

from loadtest.bus.buses import Bus
from loadtest.bus.latency import summary
from loadtest.bus.stream_shape import SAMPLE_RATE_HZ, SAMPLES_PER_FRAME, StreamShape
from messages import DecodeError, decode, encode, subjects
from messages.events import Finished
from messages.frames import AudioChunk, CodesChunk, CodesEnd, CodesMessage
from messages.requests import SynthesisRequest
from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM, codes_consumer
from services.bus.claims import claim_request
from services.bus.codes_publisher import CodesPublisher
from services.bus.prompt_pull import PromptPull
from services.bus.provision import open_bucket
from services.bus.submit import submit_request
from services.bus.terminal_guard import publish_terminal

from loadtest.bus.server_usage import ServerUsage

MODEL = "tiny"
NUM_PARTITIONS = 4  # BusConfig's default
SENT = "Bench-Sent"  # perf_counter() at a codes append's start (one process: comparable across its connections)
VOCODER_BATCH = 64


@dataclass
class Samples:
    """Milliseconds per measured quantity, and what was published, within the measuring window."""

    since: float
    ms: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, started: float, value_ms: float) -> None:
        if started >= self.since:
            self.ms.setdefault(key, []).append(value_ms)

    def count(self, key: str, started: float, amount: int = 1) -> None:
        if started >= self.since:
            self.counts[key] = self.counts.get(key, 0) + amount


@dataclass
class Level:
    bus: Bus
    streams: int
    duration_s: float
    shape: StreamShape
    warmup_s: float


async def _decode_stream(nc: Client, kv, shape: StreamShape, samples: Samples, stop: asyncio.Event,
                         offset_s: float) -> None:
    """One stream's requests back to back; the first starts `offset_s` in (streams start spread over a request)."""
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    start_at = loop.time() + offset_s
    sizes = shape.chunk_sizes()
    codes_template = [bytes(2 * 16 * n) for n in sizes]
    while not stop.is_set():
        await asyncio.sleep(max(0.0, start_at - loop.time()))
        if stop.is_set():
            return
        request_id = f"load-{uuid.uuid4().hex[:16]}"
        began = time.perf_counter()
        await submit_request(js, SynthesisRequest(id=request_id, model=MODEL, text="A load request.",
                                                  created_at=time.time()))
        samples.add("submit", began, (time.perf_counter() - began) * 1000.0)
        t = time.perf_counter()
        claim = await claim_request(kv, request_id, "load-decode")
        samples.add("claim", t, (time.perf_counter() - t) * 1000.0)
        headers: dict[str, str] = {}
        partition = subjects.partition_for(request_id, NUM_PARTITIONS)
        publisher = CodesPublisher(js, partition=partition, request_id=request_id, epoch=claim.record.epoch,
                                   headers=headers)  # the dict is read at each publish: SENT set per chunk below
        frames_done = 0
        for seq, size in enumerate(sizes):
            frames_done += size
            due = start_at + frames_done / 12.5  # generated at real time
            await asyncio.sleep(max(0.0, due - loop.time()))
            samples.add("generator_lag", time.perf_counter(), max(0.0, loop.time() - due) * 1000.0)
            chunk = CodesChunk(request_id=request_id, seq=seq, first_frame=frames_done - size, epoch=publisher.epoch,
                               dtype="int16", codes=codes_template[seq])
            t = time.perf_counter()
            headers[SENT] = repr(t)
            await publisher.publish(chunk)
            samples.add("codes_append", t, (time.perf_counter() - t) * 1000.0)
            samples.count("codes_msgs", t)
            if stop.is_set():
                return
        headers.pop(SENT, None)
        t = time.perf_counter()
        await publisher.publish(CodesEnd(request_id=request_id, seq=len(sizes), epoch=publisher.epoch,
                                         reason="finished", total_frames=shape.frames, stop="length"))
        samples.add("codes_append", t, (time.perf_counter() - t) * 1000.0)
        samples.count("codes_msgs", t)
        finished = Finished(request_id=request_id, at=time.time(), frames=shape.frames,
                            audio_seconds=shape.seconds, chunk_count=len(sizes), stop="length")
        t = time.perf_counter()
        await publish_terminal(js, request_id, finished)
        samples.add("terminal", t, (time.perf_counter() - t) * 1000.0)
        samples.count("requests", began)
        start_at = loop.time()


async def _vocoder_partition(nc: Client, partition: int, samples: Samples, stop: asyncio.Event) -> None:
    """Pull partition `partition`'s codes as the vocoder does, ack each, publish its audio."""
    pull = PromptPull(nc, CODES_STREAM, codes_consumer(partition))
    await pull.open()
    try:
        while not stop.is_set():
            for msg in await pull.fetch(VOCODER_BATCH, 0.5):
                await _voice(nc, msg, samples)
    finally:
        await pull.close()


async def _voice(nc: Client, msg: Msg, samples: Samples) -> None:
    now = time.perf_counter()
    await msg.ack()
    sent = msg.headers.get(SENT) if msg.headers else None
    if sent is None:
        return  # a CodesEnd: no audio
    started = float(sent)
    samples.add("codes_delivery", started, (now - started) * 1000.0)
    try:
        codes = decode(msg.data, CodesMessage)
    except DecodeError:
        return
    if not isinstance(codes, CodesChunk):
        return
    audio = AudioChunk(request_id=codes.request_id, seq=codes.seq, first_sample=codes.first_frame * SAMPLES_PER_FRAME,
                       sample_rate=SAMPLE_RATE_HZ, pcm=bytes(2 * SAMPLES_PER_FRAME * codes.num_frames))
    payload = encode(audio)
    await nc.publish(subjects.audio(codes.request_id), payload, headers={SENT: sent, "Audio-Sent":
                                                                           repr(time.perf_counter())})
    samples.count("audio_msgs", started)
    samples.count("audio_bytes", started, len(payload))


def _gateway_callback(samples: Samples):
    async def on_audio(msg: Msg) -> None:
        now = time.perf_counter()
        if not msg.headers:
            return
        started, sent = float(msg.headers[SENT]), float(msg.headers["Audio-Sent"])
        samples.add("audio_delivery", started, (now - sent) * 1000.0)
        samples.add("codes_to_audio", started, (now - started) * 1000.0)
    return on_audio


async def run_level(level: Level) -> dict:
    """Run `level`: N streams for its duration (the first `warmup_s` unmeasured); its summary."""
    bus = level.bus
    member = lambda i: bus.urls[i % len(bus.urls)]  # noqa: E731 - one member per role on a cluster
    decode_nc = await bus.client("load-decode", member(0))
    vocoder_nc = await bus.client("load-vocoder", member(1))
    gateway_nc = await bus.client("load-gateway", member(2))
    stop = asyncio.Event()
    samples = Samples(since=time.perf_counter() + level.warmup_s)
    tasks: list[asyncio.Task] = []
    try:
        for stream in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM):
            await decode_nc.jetstream().purge_stream(stream)  # every level starts from the same empty streams
        await gateway_nc.subscribe(f"{subjects.AUDIO_ROOT}.>", cb=_gateway_callback(samples),
                                   pending_msgs_limit=1 << 20, pending_bytes_limit=1 << 30)
        await gateway_nc.flush()
        kv = await open_bucket(decode_nc.jetstream())
        tasks += [asyncio.create_task(_vocoder_partition(vocoder_nc, p, samples, stop)) for p in range(NUM_PARTITIONS)]
        rng = random.Random(level.streams)
        tasks += [asyncio.create_task(_decode_stream(decode_nc, kv, level.shape, samples, stop,
                                                     rng.uniform(0, level.shape.seconds)))
                  for _ in range(level.streams)]
        usage = ServerUsage(bus)
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(level.warmup_s)
        usage.start()
        await _watch(tasks, level.duration_s - level.warmup_s)
        measured = usage.stop()
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        stop.set()
        await _finish(tasks)
        for nc in (decode_nc, vocoder_nc, gateway_nc):
            await nc.close()
    return _level_summary(level, samples, measured, cpu_after.ru_utime + cpu_after.ru_stime
                          - cpu_before.ru_utime - cpu_before.ru_stime)


async def _watch(tasks: list[asyncio.Task], seconds: float) -> None:
    """Wait `seconds`, ending early (with its error) if a task failed."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()


async def _finish(tasks: list[asyncio.Task]) -> None:
    """Give streams a moment to end their current publish, then cancel what is left."""
    _, pending = await asyncio.wait(tasks, timeout=5.0) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _level_summary(level: Level, samples: Samples, servers: dict, generator_cpu_s: float) -> dict:
    window = level.duration_s - level.warmup_s
    return {
        "bus": level.bus.label, "streams": level.streams, "measured_s": round(window, 2),
        "latency_ms": {key: summary(values) for key, values in sorted(samples.ms.items())},
        "per_second": {key: round(value / window, 2) for key, value in sorted(samples.counts.items())},
        "servers": servers,
        "generator_cpu_fraction": round(generator_cpu_s / level.duration_s, 3),
    }
