"""The bus at one moment, through the JetStream API (nats-py): each stream's size and age, each durable consumer's
lag; and the mesh's own word on what it holds (the gateway's live requests, decode's and the vocoder's active
requests), so both samples are taken at a quiet moment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import datetime

import httpx
import nats
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from messages import subjects
from services.metrics.names import LIVE_REQUESTS

QUIET_POLL_S = 0.5  # observing other processes' counters: there is no event to await from outside


@dataclass(frozen=True, slots=True)
class StreamSample:
    """One stream: its messages, bytes, the age of its oldest message and its retention."""

    name: str
    messages: int
    bytes: int
    oldest_age_s: float | None
    max_age_s: float | None
    max_msgs: int | None


@dataclass(frozen=True, slots=True)
class ConsumerSample:
    """One durable consumer's lag: messages not yet delivered, delivered and not acked, redelivered."""

    stream: str
    name: str
    num_pending: int
    num_ack_pending: int
    num_redelivered: int


@dataclass(frozen=True, slots=True)
class BusSample:
    """Every stream (the KV bucket's included) and durable consumer; ephemeral consumers (ordered readers, KV
    watchers) are counted, since their names change."""

    streams: list[StreamSample] = field(default_factory=list)
    consumers: list[ConsumerSample] = field(default_factory=list)
    ephemeral_consumers: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


async def sample_bus(nats_url: str) -> BusSample:
    nc = await nats.connect(nats_url, name="voxmesh-soak")
    try:
        js, now = nc.jetstream(), time.time()
        streams, consumers, ephemeral = [], [], 0
        for info in await js.streams_info():
            state, config = info.state, info.config
            age = await _oldest_age_s(js, config.name, state.first_seq, now) if state.messages else None
            streams.append(StreamSample(
                name=config.name, messages=state.messages, bytes=state.bytes, oldest_age_s=age,
                max_age_s=config.max_age or None, max_msgs=None if (config.max_msgs or -1) < 0 else config.max_msgs))
            for consumer in await js.consumers_info(config.name):
                if not consumer.config.durable_name:
                    ephemeral += 1
                    continue
                consumers.append(ConsumerSample(config.name, consumer.name, consumer.num_pending or 0,
                                                consumer.num_ack_pending or 0, consumer.num_redelivered or 0))
        return BusSample(streams, consumers, ephemeral)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def quiet(gateway_url: str, nats_url: str, timeout_s: float) -> AsyncIterator[dict[str, float]]:
    """Once the gateway holds no request and decode and the vocoder none either (a client the bench cut off at its
    deadline is cancelled after the resume window), yields those counts. Its own connections (one HTTP, one NATS)
    stay open inside, so a process sampled there counts them at every moment alike. TimeoutError past
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    nc = await nats.connect(nats_url, name="voxmesh-soak")
    try:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as http:
            while True:
                held = {"gateway_live_requests": await _gateway_live(http),
                        "decode_active_requests": await _stat(nc, "voxmesh-decode", "active_requests"),
                        "vocoder_active_streams": await _stat(nc, "voxmesh-vocoder", "active_streams")}
                if not any(held.values()):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the mesh still holds requests after {timeout_s:.0f}s: {held}")
                await asyncio.sleep(QUIET_POLL_S)
            yield held
    finally:
        await nc.close()


async def _gateway_live(http: httpx.AsyncClient) -> float:
    for family in text_string_to_metric_families((await http.get("/metrics")).text):
        if family.name == LIVE_REQUESTS:
            return sum(sample.value for sample in family.samples)
    raise RuntimeError(f"the gateway's /metrics has no {LIVE_REQUESTS}")


async def _stat(nc: Client, service: str, key: str) -> float:
    """The sum of `key` over the replicas of `service` that answer `$SRV.STATS` within a second."""
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    try:
        await nc.publish(subjects.micro_stats(service), b"", reply=inbox)
        total = 0.0
        while True:
            try:
                reply = json.loads((await replies.next_msg(timeout=1.0)).data)
            except nats.errors.TimeoutError:
                return total
            total += sum((endpoint.get("data") or {}).get(key, 0) for endpoint in reply.get("endpoints", []))
    finally:
        await replies.unsubscribe()


async def _oldest_age_s(js, stream: str, first_seq: int, now: float) -> float | None:
    """Seconds since the stream stored its oldest message (None when it cannot be read)."""
    try:
        stored = (await js.get_msg(stream, seq=first_seq)).time
    except Exception:  # noqa: BLE001 - removed meanwhile (a work queue): no age to report
        return None
    if stored is None:
        return None
    if isinstance(stored, str):  # RFC 3339 with nanoseconds; datetime takes microseconds
        whole, _, fraction = stored.rstrip("Z").partition(".")
        stored = datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00")
    return max(0.0, now - stored.timestamp())
