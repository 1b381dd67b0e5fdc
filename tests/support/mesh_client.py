"""What the end-to-end tests do to a running mesh: stream over WebSocket, read the bus, ask the services."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import nats
import nats.errors
import numpy as np
import websockets

from messages import CodesChunk, CodesEnd, CodesMessage, LifecycleEvent, decode, subjects
from messages.streams import CODES_STREAM, EVENTS_STREAM
from services.bus.leases import live_replicas
from services.bus.provision import open_bucket

NUM_PARTITIONS = 4  # compose/single.yml's VOXMESH_NUM_PARTITIONS
WAIT_S = 120.0  # bound on any single wait against the mesh


@dataclass
class StreamResult:
    """One WebSocket request as the client saw it."""

    start: dict
    pcm: bytes = b""
    end: dict = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.start["request_id"]


async def stream_speech(gateway_url: str, body: dict, first_audio: asyncio.Event | None = None,
                        started: dict | None = None, tls: ssl.SSLContext | None = None) -> StreamResult:
    """Send one request over `/v1/audio/speech/stream`; collect PCM until `audio.done` or `error`.

    `first_audio` is set at the first PCM frame; `started` is filled with the `audio.start` event; `tls` verifies an
    https gateway (its socket is wss)."""
    url = gateway_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
    async with websockets.connect(url, max_size=None, ssl=tls) as socket:
        await socket.send(json.dumps(body))
        start = json.loads(await asyncio.wait_for(socket.recv(), WAIT_S))
        if start.get("type") != "audio.start":
            return StreamResult(start={"request_id": start.get("request_id")}, end=start)
        result = StreamResult(start=start)
        if started is not None:
            started.update(start)
        pcm = bytearray()
        while True:
            message = await asyncio.wait_for(socket.recv(), WAIT_S)
            if isinstance(message, bytes):
                pcm += message
                if first_audio is not None:
                    first_audio.set()
                continue
            result.end = json.loads(message)
            break
        result.pcm = bytes(pcm)
        return result


FAULT_BODIES = (
    {"input": "A long sentence that keeps the stages busy for a while.", "voice": "vivian", "max_new_tokens": 200,
     "ignore_eos": True, "seed": 3},
    {"input": "Another voice speaks beside it, just as long.", "voice": "ryan", "max_new_tokens": 160,
     "ignore_eos": True, "seed": 4},
)
"""Two long requests with fixed seeds that fault tests stream at once and kill a stage under."""


@dataclass
class LiveStream:
    """One WebSocket request followed as it streams: its audio frames so far (one per chunk), its `audio.start` and
    end event (`audio.done` or `error`), and whether the socket closed before any end event came."""

    start: dict = field(default_factory=dict)
    frames: list[bytes] = field(default_factory=list)
    end: dict = field(default_factory=dict)
    closed: bool = False
    first_audio: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def request_id(self) -> str:
        return self.start["request_id"]

    @property
    def pcm(self) -> bytes:
        return b"".join(self.frames)


async def follow(gateway_url: str, message: dict, live: LiveStream) -> LiveStream:
    """Send `message` (a one-shot request body, or a `resume`) on a new socket and fill `live` until the end event
    or until the socket dies."""
    url = gateway_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    try:
        async with websockets.connect(url, max_size=None) as socket:
            await socket.send(json.dumps(message))
            while True:
                received = await asyncio.wait_for(socket.recv(), WAIT_S)
                if isinstance(received, bytes):
                    live.frames.append(received)
                    live.first_audio.set()
                    continue
                event = json.loads(received)
                if event.get("type") == "audio.start":
                    live.start = event
                elif event.get("type") in ("audio.done", "error"):
                    live.end = event
                    return live
    except websockets.ConnectionClosed:
        live.closed = True
        return live


async def start_streams(gateway_url: str, bodies) -> tuple[list[LiveStream], list[asyncio.Task]]:
    """Start one request per body at once; return once every one of them is playing (has audio)."""
    lives = [LiveStream() for _ in bodies]
    tasks = [asyncio.create_task(follow(gateway_url, body, live)) for body, live in zip(bodies, lives)]
    for live, task in zip(lives, tasks):
        first = asyncio.ensure_future(live.first_audio.wait())
        await asyncio.wait([first, task], timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        if not live.first_audio.is_set():
            raise AssertionError(f"a request never played: {task.result() if task.done() else 'no audio in time'}")
    return lives, tasks


async def codes_on_bus(nats_url: str, request_id: str) -> tuple[np.ndarray, CodesEnd]:
    """The request's frames as recorded in CODES (newest epoch wins), and its CodesEnd."""
    nc = await nats.connect(nats_url)
    try:
        subject = subjects.codes(subjects.partition_for(request_id, NUM_PARTITIONS), request_id)
        sub = await nc.jetstream().subscribe(subject, stream=CODES_STREAM, ordered_consumer=True)
        frames: dict[int, np.ndarray] = {}
        while True:
            msg = await sub.next_msg(timeout=WAIT_S)
            message = decode(msg.data, CodesMessage)
            if isinstance(message, CodesChunk):
                for offset, row in enumerate(message.frames()):
                    frames[message.first_frame + offset] = row
            elif isinstance(message, CodesEnd):
                ordered = [frames[i] for i in range(len(frames))]
                return (np.stack(ordered) if ordered else np.zeros((0, 16), np.int64)), message
    finally:
        await nc.close()


async def events_of(nats_url: str, request_id: str) -> list:
    """Every lifecycle event of a request, from the EVENTS stream, up to and including its terminal."""
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().subscribe(subjects.events_of(request_id), stream=EVENTS_STREAM,
                                             ordered_consumer=True)
        found = []
        while True:
            msg = await sub.next_msg(timeout=WAIT_S)
            found.append(decode(msg.data, LifecycleEvent))
            if msg.subject == subjects.terminal(request_id):
                return found
    finally:
        await nc.close()


async def terminal_count(nats_url: str, request_id: str) -> int:
    """How many messages the request's terminal subject holds in EVENTS."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(EVENTS_STREAM, subjects_filter=subjects.terminal(request_id))
        return (info.state.subjects or {}).get(subjects.terminal(request_id), 0)
    finally:
        await nc.close()


async def service_stats(nats_url: str, service: str) -> list[dict]:
    """The `data` of every endpoint of every replica of `service` answering `$SRV.STATS`."""
    nc = await nats.connect(nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(subjects.micro_stats(service), b"", reply=inbox)
        reply = json.loads((await sub.next_msg(timeout=10)).data)
        return [endpoint.get("data") or {} for endpoint in reply.get("endpoints", [])]
    finally:
        await nc.close()


async def one_replica_stats(nats_url: str, service: str) -> dict:
    """The STATS `data` of the one replica of `service` (every endpoint of a replica reports the replica's: a base
    checkpoint's decode has two; data that differ mean more than one replica answered)."""
    endpoints = await service_stats(nats_url, service)
    assert endpoints and all(data == endpoints[0] for data in endpoints), endpoints
    return endpoints[0]


async def replicas_serving(nats_url: str, service: str, count: int = 1, excluding=()) -> list[str]:
    """Wait until `count` replicas of `service` hold a live lease, so they are discoverable and serving (a replica
    renews its lease only once its micro service is registered); returns their names. `voxmesh up` says it is
    serving once the gateway is ready, which says nothing of a prefill or mtp replica. Replicas named in `excluding`
    do not count (a killed one's lease stays live until it expires: wait for its successor by excluding it)."""
    nc = await nats.connect(nats_url)
    try:
        kv = await open_bucket(nc.jetstream())
        renewals = await kv.watch(subjects.all_lease_keys())  # every replica renews each second: this wakes the wait
        async with asyncio.timeout(WAIT_S):
            while len(live := [r for r in await live_replicas(kv, service) if r not in excluding]) < count:
                await renewals.updates(timeout=WAIT_S)
        await renewals.stop()
        return live
    finally:
        await nc.close()


async def replica_stats(nats_url: str, service: str, count: int) -> dict[str, dict]:
    """The STATS `data` of each of the `count` replicas of `service` (micro name), by replica name."""
    nc = await nats.connect(nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(subjects.micro_stats(service), b"", reply=inbox)
        found = {}
        for _ in range(count):
            reply = json.loads((await sub.next_msg(timeout=10)).data)
            found[reply["metadata"]["replica"]] = (reply.get("endpoints") or [{}])[0].get("data") or {}
        return found
    finally:
        await nc.close()


async def settled_replica_stats(nats_url: str, service: str, count: int,
                                settled: Callable[[dict[str, dict]], bool]) -> dict[str, dict]:
    """`replica_stats` once `settled(stats)` holds: asked again at each lease renewal in the mesh (the replicas'
    control loops tick with their leases), bounded by WAIT_S."""
    nc = await nats.connect(nats_url)
    watcher = await (await open_bucket(nc.jetstream())).watch(subjects.all_lease_keys())
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                try:
                    stats = await replica_stats(nats_url, service, count)
                    if settled(stats):
                        return stats
                except nats.errors.TimeoutError:
                    pass  # a replica not answering yet: starting, or restarting after a kill
                await watcher.updates(timeout=WAIT_S)
    finally:
        await watcher.stop()
        await nc.close()


async def assert_as_undisturbed(nats_url: str, results: list[LiveStream], undisturbed: list[LiveStream]) -> None:
    """Each disturbed request completed with the undisturbed run's audio, byte for byte, one frame per chunk (no
    duplicate, no gap), and exactly one terminal event."""
    for live, reference in zip(results, undisturbed, strict=True):
        assert reference.end.get("type") == "audio.done", reference.end
        assert live.end.get("type") == "audio.done", live.end
        assert len(live.frames) == live.end["chunk_count"] == reference.end["chunk_count"], "one frame per chunk"
        assert live.pcm == reference.pcm, f"{live.request_id}: the audio differs from the undisturbed run"
        assert await terminal_count(nats_url, live.request_id) == 1


def undisturbed_run(gateway_url: str, bodies=FAULT_BODIES) -> list[LiveStream]:
    """(From synchronous code: a module fixture.) `bodies` streamed together with nothing disturbed: what every
    disturbed run of them must reproduce."""
    async def run() -> list[LiveStream]:
        _, tasks = await start_streams(gateway_url, bodies)
        return list(await asyncio.gather(*tasks))

    return asyncio.run(run())
