"""Leases and liveness, micro-service discovery ($SRV), request-id logging (the service lifecycle, with its
graceful shutdown: tests/bus/test_runtime_lifecycle.py)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from nats.micro.service import ServiceVerb, control_subject

from messages import subjects
from messages.errors import InvalidConfig
from messages.streams import BusConfig
from services.bus import LeaseKeeper, is_alive, lease_expired, read_lease, register_service, request_context
from services.bus.logs import ContextFilter
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny",), num_partitions=1)
TIMEOUT_S = 10.0


async def next_value(watcher):
    """The next real update of a KV watcher (skipping the 'no pending updates' marker)."""
    while True:
        entry = await watcher.updates(TIMEOUT_S)
        if entry is not None:
            return entry


async def test_leases_are_renewed_and_expiry_is_detected(nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    keeper = LeaseKeeper(kv, "decode-a", "decode", interval_s=0.05, ttl_s=0.5)
    watcher = await kv.watch(keeper.key)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    first, second = await next_value(watcher), await next_value(watcher)
    assert second.revision > first.revision  # renewed on its own
    task.cancel()  # a crash: the lease is left behind, no longer renewed
    with pytest.raises(asyncio.CancelledError):
        await task
    lease = await read_lease(kv, "decode-a")
    assert (lease.replica, lease.service, lease.ttl_s) == ("decode-a", "decode", 0.5)
    assert await is_alive(kv, "decode-a", now=lease.renewed_at + 0.4)
    assert not await is_alive(kv, "decode-a", now=lease.renewed_at + 0.6)  # expiry detected
    assert lease_expired(None) and not await is_alive(kv, "never-seen")
    await watcher.stop()


async def test_a_clean_stop_releases_the_lease(nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    keeper = LeaseKeeper(kv, "vocoder-a", "vocoder", interval_s=0.05, ttl_s=60.0)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    watcher = await kv.watch(keeper.key)
    await next_value(watcher)
    stop.set()
    await asyncio.wait_for(task, TIMEOUT_S)
    assert await read_lease(kv, "vocoder-a") is None and not await is_alive(kv, "vocoder-a")
    await watcher.stop()
    with pytest.raises(InvalidConfig):
        LeaseKeeper(kv, "x", "decode", interval_s=3.0, ttl_s=3.0)


async def test_services_answer_srv_ping_info_and_stats(nats_client) -> None:
    service = await register_service(nats_client, "voxmesh-decode", version="0.1.0", description="decode",
                                     metadata={"replica": "decode-a"})
    try:
        ping = json.loads((await nats_client.request(control_subject(ServiceVerb.PING, None), b"", 5.0)).data)
        info = json.loads((await nats_client.request(
            control_subject(ServiceVerb.INFO, "voxmesh-decode"), b"", 5.0)).data)
        stats = json.loads((await nats_client.request(
            control_subject(ServiceVerb.STATS, "voxmesh-decode", service.id), b"", 5.0)).data)
    finally:
        await service.stop()
    assert ping["name"] == "voxmesh-decode" and ping["id"] == service.id
    assert info["description"] == "decode" and info["metadata"] == {"replica": "decode-a"}
    assert stats["type"] == "io.nats.micro.v1.stats_response"
    with pytest.raises(InvalidConfig):
        await register_service(nats_client, "bad.name")


async def test_log_lines_carry_the_request_id() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(ContextFilter("decode"))
    logger = logging.getLogger("voxmesh.test.requestid")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def in_a_task() -> None:
        logger.info("inside a task")

    try:
        with request_context("req-42"):
            logger.info("inside")
            await asyncio.create_task(in_a_task())
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    assert [(r.request_id, r.service) for r in records] == [("req-42", "decode"), ("req-42", "decode"),
                                                            ("-", "decode")]


async def test_a_read_of_every_lease_leaves_no_consumer_behind(nats_client) -> None:
    """`current_records` reads through a consumer of the bucket's stream; the server holds at most 1,000 a stream,
    so readiness probes and control loops that read every second must not leave theirs for nats-py's default 5
    minutes (that filled the stream within 90 s of a mesh start on the H200)."""
    from services.bus.kvstore import ONE_READ_CONSUMER_IDLE_S, current_records
    from services.bus.leases import Lease

    js = nats_client.jetstream()
    kv = await fresh_bus(js, CONFIG)
    stream = f"KV_{CONFIG.bucket().name}"
    before = (await js.stream_info(stream)).state.consumer_count
    for _ in range(20):
        assert await current_records(kv, subjects.all_lease_keys(), Lease) == []
    assert (await js.stream_info(stream)).state.consumer_count > before  # the reads' consumers, not yet gone
    deadline = asyncio.get_running_loop().time() + ONE_READ_CONSUMER_IDLE_S + TIMEOUT_S
    while (await js.stream_info(stream)).state.consumer_count > before:
        assert asyncio.get_running_loop().time() < deadline, "the reads' consumers outlived their idle limit"
        await asyncio.sleep(0.2)  # polling the server's state until it holds, bounded by the deadline
