"""Helpers for the vocoder tests (no tests here): a real tiny codec checkpoint, a fresh bus on the real nats-server,
the vocoder service running in-process (`services.vocoder.service.serve`), a stand-in decode replica that publishes
real TakeoverMarker / CodesChunk / CodesEnd messages the way decode does (owner claim, lease, fenced publisher), and
a listener for a request's audio and terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from messages import decode, subjects
from messages.base import ErrorInfo, Usage
from messages.events import Failed, Finished, TerminalEvent
from messages.frames import AudioChunk, CodesChunk, CodesEnd
from messages.streams import EVENTS_STREAM, BusConfig
from services.bus.claims import claim_request, read_partition
from services.bus.codes_publisher import CodesPublisher
from services.bus.connection import connect
from services.bus.leases import LeaseKeeper
from services.vocoder.service import CODEC_SUBDIR, VocoderSettings, serve, status_subject
from tests.support.nats_server import fresh_bus

NUM_PARTITIONS = 2
WAIT_S = 60.0  # a guard against a hang, never a synchronisation


@pytest.fixture(scope="session")
def codec_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory whose speech_tokenizer/ holds a real tiny codec (the CODEC helper's writer)."""
    from services.random_checkpoint.codec_writer import write_codec_checkpoint

    root = tmp_path_factory.mktemp("vocoder-ckpt")
    write_codec_checkpoint(root, "tiny", seed=0, dtype="float32")
    if not (root / CODEC_SUBDIR / "config.json").is_file():
        raise RuntimeError(f"write_codec_checkpoint did not write {root / CODEC_SUBDIR}/config.json")
    return root


@pytest.fixture(scope="session")
def codec_decoder(codec_model_dir: Path):
    """The same codec, loaded here: the oracle for full decodes."""
    from services.model.codec import load_codec_decoder

    return load_codec_decoder(codec_model_dir / CODEC_SUBDIR, "cpu", torch.float32)


@dataclass
class Bus:
    nc: Client
    js: JetStreamContext
    kv: KeyValue
    url: str


@pytest.fixture
async def bus(nats_server) -> AsyncIterator[Bus]:
    """A fresh, provisioned bus (short codes ack wait so redeliveries after a death come quickly)."""
    nc = await connect(nats_server.url, "voxmesh-vocoder-test", initial_timeout_s=10.0)
    js = nc.jetstream()
    kv = await fresh_bus(js, BusConfig(num_partitions=NUM_PARTITIONS, codes_ack_wait_s=2.0, storage="memory"))
    try:
        yield Bus(nc, js, kv, nats_server.url)
    finally:
        await nc.close()


def vocoder_settings(bus: Bus, model_dir: Path, replica: str, **overrides) -> VocoderSettings:
    values = dict(nats_url=bus.url, model_dir=str(model_dir), replica=replica, num_partitions=NUM_PARTITIONS,
                  tick_s=0.2, lease_ttl_s=1.0)
    values.update(overrides)
    return VocoderSettings(**values)


async def await_partitions(kv: KeyValue, replica: str, partitions: range | list[int]) -> None:
    """Wait (by watching the keys) until `replica` owns every partition given."""
    for partition in partitions:
        watcher = await kv.watch(subjects.partition_key(partition))
        try:
            while True:
                claim = await read_partition(kv, partition)
                if claim is not None and claim.record.replica == replica:
                    break
                await watcher.updates(timeout=WAIT_S)
        finally:
            await watcher.stop()


@contextlib.asynccontextmanager
async def running_vocoder(bus: Bus, model_dir: Path, replica: str = "vocoder-test", *,
                          owns: range | list[int] = range(NUM_PARTITIONS), **overrides):
    """The real vocoder service, in-process, once it owns the partitions `owns` (every one unless told: the only
    vocoder serves them all); stopped (drained) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(vocoder_settings(bus, model_dir, replica, **overrides), stop))
    try:
        await asyncio.wait_for(_first_done(task, await_partitions(bus.kv, replica, owns)), WAIT_S)
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def _first_done(task: asyncio.Task, ready) -> None:
    waiter = asyncio.ensure_future(ready)
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises what killed the service
        raise RuntimeError("the vocoder service returned before owning its partitions")


def random_codes(num_frames: int, codebook_size: int, seed: int) -> np.ndarray:
    generator = np.random.default_rng(seed)
    return generator.integers(0, codebook_size, size=(num_frames, 16), dtype=np.int64)


def chunk_sizes(num_frames: int, initial: int = 2, later: int = 8) -> list[int]:
    """Decode's chunking rule: `initial` frames, then `later`, the last chunk shorter."""
    sizes, left = [], num_frames
    while left > 0:
        size = min(left, initial if not sizes else later)
        sizes.append(size)
        left -= size
    return sizes


class StandInDecode:
    """Publishes one request's codes the way decode does: claims `owner.<id>`, holds a lease, publishes a
    TakeoverMarker first, then fenced CodesChunks and a CodesEnd. `stop_lease()` makes it look dead."""

    def __init__(self, bus: Bus, request_id: str, *, replica: str = "decode-standin", lease_ttl_s: float = 30.0):
        self.bus = bus
        self.request_id = request_id
        self.replica = replica
        self.partition = subjects.partition_for(request_id, NUM_PARTITIONS)
        self.lease = LeaseKeeper(bus.kv, replica, "decode", interval_s=min(1.0, lease_ttl_s / 2), ttl_s=lease_ttl_s)
        self.publisher: CodesPublisher | None = None
        self.next_seq = 0
        self.frames = 0

    async def start(self) -> None:
        await self.lease.renew()
        claim = await claim_request(self.bus.kv, self.request_id, self.replica)
        self.publisher = await CodesPublisher.take_over(
            self.bus.js, partition=self.partition, request_id=self.request_id, epoch=claim.record.epoch,
            replica=self.replica, last_sequence=0, resume_frame=0, next_seq=0)

    async def chunk(self, frames: np.ndarray, context: np.ndarray | None = None) -> CodesChunk:
        message = CodesChunk.from_frames(request_id=self.request_id, seq=self.next_seq, first_frame=self.frames,
                                         epoch=self.publisher.epoch, frames=frames, context=context)
        await self.publisher.publish(message)
        self.next_seq += 1
        self.frames += frames.shape[0]
        return message

    async def chunks(self, codes: np.ndarray, sizes: list[int], context: np.ndarray | None = None) -> None:
        """Publish `codes` in chunks of `sizes`; the first carries `context` (frames decoded before it, unvoiced)."""
        start = 0
        for size in sizes:
            await self.chunk(codes[start:start + size], context if start == 0 else None)
            start += size

    async def finish(self, stop: str = "eos") -> CodesEnd:
        end = CodesEnd(request_id=self.request_id, seq=self.next_seq, epoch=self.publisher.epoch,
                       reason="finished", total_frames=self.frames, stop=stop,
                       usage=Usage(input_chars=5, output_frames=self.frames))
        await self.publisher.publish(end)
        return end

    async def fail(self, error: ErrorInfo) -> CodesEnd:
        end = CodesEnd(request_id=self.request_id, seq=self.next_seq, epoch=self.publisher.epoch,
                       reason="failed", total_frames=self.frames, error=error)
        await self.publisher.publish(end)
        return end


@dataclass
class Listener:
    """A request's audio and terminal, as the gateway would see them (subscribed before anything is published)."""

    audio_sub: Subscription
    terminal_sub: Subscription
    audio: list[AudioChunk] = field(default_factory=list)

    @classmethod
    async def open(cls, nc: Client, request_id: str) -> Listener:
        audio = await nc.subscribe(subjects.audio(request_id))
        terminal = await nc.subscribe(subjects.terminal(request_id))
        await nc.flush()
        return cls(audio, terminal)

    async def next_audio(self) -> AudioChunk:
        chunk = decode((await self.audio_sub.next_msg(timeout=WAIT_S)).data, AudioChunk)
        self.audio.append(chunk)
        return chunk

    async def audio_chunks(self, count: int) -> list[AudioChunk]:
        return [await self.next_audio() for _ in range(count)]

    async def terminal(self) -> TerminalEvent:
        """The terminal event; every audio chunk that reached us before it is moved into `audio`."""
        event = decode((await self.terminal_sub.next_msg(timeout=WAIT_S)).data, Finished | Failed)
        while self.audio_sub.pending_msgs > 0:  # already read off the socket before the terminal: no waiting
            self.audio.append(decode((await self.audio_sub.next_msg()).data, AudioChunk))
        return event

    async def close(self) -> None:
        await self.audio_sub.unsubscribe()
        await self.terminal_sub.unsubscribe()


async def stored_terminals(js: JetStreamContext, request_id: str) -> list[TerminalEvent]:
    """Every terminal event EVENTS holds for the request (the guard allows one)."""
    found, seq = [], 1
    while True:
        try:
            raw = await js.get_msg(EVENTS_STREAM, seq=seq, subject=subjects.terminal(request_id), next=True)
        except NotFoundError:
            return found
        found.append(decode(raw.data, Finished | Failed))
        seq = raw.seq + 1


def pcm_of(chunks: list[AudioChunk]) -> np.ndarray:
    ordered = sorted(chunks, key=lambda c: c.seq)
    return np.concatenate([c.samples() for c in ordered]) if ordered else np.zeros(0, dtype=np.int16)


def full_decode_pcm(decoder, codes: np.ndarray) -> np.ndarray:
    """The oracle: one full decode of all codes, as int16 the way AudioChunk quantises."""
    with torch.inference_mode():
        samples = decoder.decode(torch.from_numpy(codes)).numpy()
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


async def status(bus: Bus, replica: str) -> dict:
    """The vocoder replica's answer on its `status` endpoint."""
    return json.loads((await bus.nc.request(status_subject(replica), b"", timeout=WAIT_S)).data)


async def settled_status(bus: Bus, replica: str, settled) -> dict:
    """The replica's status once `settled(status)` holds (bounded by WAIT_S). A terminal event is stored before the
    replica's own bookkeeping of it (release, counters) runs, so a status read right after it can be one step old."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = await status(bus, replica)
        if settled(stats) or time.monotonic() > deadline:
            return stats
