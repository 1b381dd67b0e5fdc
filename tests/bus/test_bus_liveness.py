"""Leases and liveness, micro-service discovery ($SRV), request-id logging (the service lifecycle, with its
graceful shutdown: tests/bus/test_runtime_lifecycle.py)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from nats.micro.service import ServiceVerb, control_subject

from messages import encode, subjects
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


async def test_every_current_lease_is_read_from_the_leader_with_no_consumer(nats_client) -> None:
    """`current_records` lists the keys from the stream's info and reads each value with the leader's message get:
    it creates no consumer (a watch's ephemeral consumer may sit on a peer that is catching up, and readiness probes
    and control loops read every second), it sees the latest renewal of each key, and a deleted key is gone."""
    from services.bus.kvstore import current_records
    from services.bus.leases import Lease

    js = nats_client.jetstream()
    kv = await fresh_bus(js, CONFIG)
    stream = f"KV_{CONFIG.bucket().name}"
    before = (await js.stream_info(stream)).state.consumer_count
    assert await current_records(kv, subjects.all_lease_keys(), Lease) == []
    leases = [Lease(replica=name, service="decode", renewed_at=at, ttl_s=3.0)
              for name, at in (("d-1", 1.0), ("d-2", 2.0), ("d-3", 3.0))]
    for lease in leases:
        await kv.put(subjects.lease_key(lease.replica), encode(lease))
    renewed = Lease(replica="d-1", service="decode", renewed_at=9.0, ttl_s=3.0)
    await kv.put(subjects.lease_key("d-1"), encode(renewed))
    await kv.delete(subjects.lease_key("d-2"))
    await kv.put(subjects.partition_key(0), b"not a lease")  # another pattern's key is not listed
    for _ in range(20):
        found = await current_records(kv, subjects.all_lease_keys(), Lease)
        assert sorted(found, key=lambda lease: lease.replica) == [renewed, leases[2]]
    assert (await js.stream_info(stream)).state.consumer_count == before, "no read left a consumer"
