"""Helpers for the decode service tests (no tests here): a decode replica running in-process against a real
nats-server, a reader of the CODES stream and the events, and the offline oracle (`services.model.generate`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.micro.service import ServiceVerb, control_subject

from messages import decode, encode, subjects
from messages.events import LifecycleEvent
from messages.frames import CodesChunk, CodesEnd, CodesMessage, TakeoverMarker
from messages.requests import SamplingSpec, SynthesisRequest
from messages.streams import BusConfig
from services.bus.connection import connect
from services.decode.service import SERVICE_NAME, serve
from services.decode.settings import DecodeSettings
from services.model.generate import default_sampling, generate
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text
from services.model.text_tokenizer import TextTokenizer
from tests.support.nats_server import fresh_bus

MODEL = "tiny"
REPLICA = "decode-test"
NUM_PARTITIONS = 2
WAIT_S = 120.0  # a guard against a hang, never a synchronisation
GREEDY = SamplingSpec(temperature=0.0)


@dataclass
class Oracle:
    """Offline greedy generation of one request alone: what the mesh must reproduce."""

    checkpoint: Path
    _model: Any = None
    _tokenizer: TextTokenizer | None = None

    def codes(self, request: SynthesisRequest) -> np.ndarray:
        if self._model is None:
            self._model = load_model(self.checkpoint)
            self._tokenizer = TextTokenizer.from_dir(self.checkpoint)
        prompt = PromptRequest(text_ids=tuple(self._tokenizer.encode(assistant_text(request.text))),
                               speaker=request.speaker, language=request.language,
                               non_streaming=request.text_mode == "non-streaming")
        talker, predictor = default_sampling(self._model.generation, greedy=True)
        with torch.inference_mode():
            return generate(self._model, prompt, request.max_new_tokens, talker, predictor, request.seed).numpy()


def synthesis(request_id: str, text: str, frames: int, **fields: Any) -> SynthesisRequest:
    """A greedy request for the tiny model capped at `frames` frames."""
    fields.setdefault("speaker", "ryan")
    fields.setdefault("language", "english")
    fields.setdefault("model", MODEL)
    return SynthesisRequest(id=request_id, text=text, max_new_tokens=frames, sampling=GREEDY, **fields)


@dataclass
class CodesLog:
    """Every message on CODES and every lifecycle event, by request, with awaitable milestones."""

    codes: dict[str, list[CodesMessage]] = field(default_factory=lambda: defaultdict(list))
    events: dict[str, list[LifecycleEvent]] = field(default_factory=lambda: defaultdict(list))
    _first_chunk: dict[str, asyncio.Future] = field(default_factory=dict)
    _end: dict[str, asyncio.Future] = field(default_factory=dict)

    def _future(self, table: dict[str, asyncio.Future], request_id: str) -> asyncio.Future:
        if request_id not in table:
            table[request_id] = asyncio.get_running_loop().create_future()
        return table[request_id]

    async def on_codes(self, msg) -> None:
        message = decode(msg.data, CodesMessage)
        self.codes[message.request_id].append(message)
        if isinstance(message, CodesChunk):
            future = self._future(self._first_chunk, message.request_id)
            if not future.done():
                future.set_result(message)
        if isinstance(message, CodesEnd):
            self._future(self._end, message.request_id).set_result(message)

    async def on_event(self, msg) -> None:
        event = decode(msg.data, LifecycleEvent)
        self.events[event.request_id].append(event)

    async def first_chunk(self, request_id: str) -> CodesChunk:
        return await asyncio.wait_for(asyncio.shield(self._future(self._first_chunk, request_id)), WAIT_S)

    async def end(self, request_id: str) -> CodesEnd:
        return await asyncio.wait_for(asyncio.shield(self._future(self._end, request_id)), WAIT_S)

    def frames(self, request_id: str) -> np.ndarray:
        """The request's frames from its chunks, checking the chunk numbering and frame offsets on the way."""
        chunks = [m for m in self.codes[request_id] if isinstance(m, CodesChunk)]
        assert [c.seq for c in chunks] == list(range(len(chunks)))
        offsets = np.cumsum([0] + [c.num_frames for c in chunks])
        assert [c.first_frame for c in chunks] == offsets[:-1].tolist()
        return np.concatenate([c.frames() for c in chunks]) if chunks else np.zeros((0, 16), dtype=np.int64)

    def chunk_sizes(self, request_id: str) -> list[int]:
        return [m.num_frames for m in self.codes[request_id] if isinstance(m, CodesChunk)]

    def kinds(self, request_id: str) -> list[str]:
        return [type(event).__name__ for event in self.events[request_id]]


@dataclass
class DecodeUnderTest:
    """A decode replica serving in this process, and a client of the same server."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    log: CodesLog
    task: asyncio.Task

    async def submit(self, request: SynthesisRequest) -> None:
        """Onto decode's direct queue (where prefill leaves requests)."""
        await self.js.publish(subjects.request(MODEL), encode(request))

    async def submit_in_lane(self, request: SynthesisRequest) -> None:
        """Onto the lane of the request's priority and tenant, as the gateway publishes it."""
        await self.js.publish(subjects.request_for(MODEL, request.priority, request.tenant), encode(request))

    async def stats(self) -> dict[str, Any]:
        reply = await self.nc.request(control_subject(ServiceVerb.STATS, SERVICE_NAME), b"", timeout=10.0)
        return json.loads(reply.data)["endpoints"][0]["data"]

    async def settled_stats(self, settled: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The stats once `settled(stats)` holds (bounded by WAIT_S). A CodesEnd or terminal is stored before the
        replica counts it (the counters run once the publish is acknowledged), so a read right after it can be one
        step old."""
        deadline = time.monotonic() + WAIT_S
        while True:
            stats = await self.stats()
            if settled(stats) or time.monotonic() > deadline:
                return stats

    async def idle_stats(self) -> dict[str, Any]:
        """The stats once every request this replica took has ended and been counted: what a test reads after
        awaiting the last CodesEnd or terminal."""
        return await self.settled_stats(lambda s: s["active_requests"] == 0 and s["active_sequences"] == 0)

    def check_running(self) -> None:
        if self.task.done():
            self.task.result()  # raises the service's error
            raise AssertionError("the decode service stopped on its own")


@contextlib.asynccontextmanager
async def running_decode(url: str, checkpoint: Path, **overrides: Any) -> AsyncIterator[DecodeUnderTest]:
    """Fresh streams and bucket, a codes/events reader, then a decode replica until the block ends."""
    nc = await connect(url, "decode-test-client", initial_timeout_s=10.0)
    js = nc.jetstream()
    kv = await fresh_bus(js, BusConfig(models=(MODEL,), num_partitions=NUM_PARTITIONS, storage="memory"))
    log = CodesLog()
    subs = [await js.subscribe(subjects.all_codes(), cb=log.on_codes, ordered_consumer=True),
            await nc.subscribe(subjects.all_events(), cb=log.on_event)]
    settings = DecodeSettings(nats_url=url, model_dir=str(checkpoint), model_name=MODEL, replica=REPLICA,
                              num_partitions=NUM_PARTITIONS, shutdown_grace_s=0.0, **overrides)
    lease = await kv.watch(subjects.lease_key(REPLICA))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop))
    try:
        await _until_leased(lease, task)
        yield DecodeUnderTest(nc, js, kv, log, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
        await lease.stop()
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()


async def _until_leased(lease_watch, task: asyncio.Task) -> None:
    """The replica's first lease: it is serving. A service that dies first raises its error here."""
    while True:
        update = asyncio.ensure_future(lease_watch.updates(WAIT_S))
        done, _ = await asyncio.wait([update, task], return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            update.cancel()
            task.result()
            raise AssertionError("the decode service returned before serving")
        entry = update.result()
        if entry is not None and entry.value:
            return


def takeover_then(log: CodesLog, request_id: str) -> tuple[TakeoverMarker, CodesEnd]:
    """The first and last message of a request's codes subject (a marker, then its end)."""
    messages = log.codes[request_id]
    assert isinstance(messages[0], TakeoverMarker), messages[0]
    assert isinstance(messages[-1], CodesEnd), messages[-1]
    return messages[0], messages[-1]
