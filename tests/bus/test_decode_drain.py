"""The operator drain endpoint and the service's own shutdown, against a real nats-server and the tiny model."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
from nats.micro.service import ServiceVerb, control_subject

from messages import decode as decode_message
from messages import subjects
from messages.errors import ErrorCode, Stage
from messages.frames import CodesEnd
from messages.streams import CODES_STREAM
from services.bus.connection import connect
from services.bus.leases import read_lease
from services.bus.provision import open_bucket
from services.decode.drain import drain_subject
from services.decode.service import SERVICE_NAME
from tests.support.decode_stubs import (
    NUM_PARTITIONS,
    REPLICA,
    Oracle,
    running_decode,
    synthesis,
)

LONG = 60  # frames; the greedy run of this text reaches them without EOS
TEXT = "speak and the voice"


async def drain(decode, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else b""
    reply = await decode.nc.request(drain_subject(REPLICA), data, timeout=30.0)
    return json.loads(reply.data)


async def test_drain_in_allow_mode_requeues_and_the_request_resumes_faithfully(nats_server, tiny_checkpoint):
    request = synthesis("drain-allow", TEXT, frames=LONG)
    async with running_decode(nats_server.url, tiny_checkpoint, recompute_preemption="allow") as decode:
        await decode.submit(request)
        await decode.log.first_chunk(request.id)
        result = await drain(decode)
        end = await decode.log.end(request.id)
        stats = await decode.idle_stats()
    assert result == {"replica": REPLICA, "drained": [], "requeued": [request.id]}
    assert end.reason == "finished" and end.total_frames == LONG
    np.testing.assert_array_equal(decode.log.frames(request.id), Oracle(tiny_checkpoint).codes(request))
    preempted = [e for e in decode.log.events[request.id] if type(e).__name__ == "Preempted"]
    assert [e.cause for e in preempted] == ["drain"]
    kinds = decode.log.kinds(request.id)
    assert kinds.index("Preempted") < kinds.index("Resumed")
    assert stats["drains"] == 1 and stats["is_draining"] is False


async def test_drain_in_fail_mode_ends_the_request_drained_and_the_replica_serves_on(nats_server, tiny_checkpoint):
    request = synthesis("drain-fail", TEXT, frames=LONG)
    after = synthesis("after-drain", "hello the voice", frames=6)
    async with running_decode(nats_server.url, tiny_checkpoint, recompute_preemption="fail") as decode:
        await decode.submit(request)
        await decode.log.first_chunk(request.id)
        sent_at = time.time()
        draining = asyncio.create_task(drain(decode, {"hold_s": 1.0}))
        end = await decode.log.end(request.id)
        await decode.submit(after)  # arrives while the replica is drained: pulled only once the scope ends
        result = await draining
        after_end = await decode.log.end(after.id)
    assert result == {"replica": REPLICA, "drained": [request.id], "requeued": []}
    assert end.reason == "failed" and end.error.code == ErrorCode.DRAINED and end.error.stage == Stage.DECODE
    published = decode.log.frames(request.id)
    assert 0 < end.total_frames == len(published) < LONG
    np.testing.assert_array_equal(published, Oracle(tiny_checkpoint).codes(request)[: len(published)])
    assert after_end.reason == "finished"
    started = next(e for e in decode.log.events[after.id] if type(e).__name__ == "Started")
    assert started.at >= sent_at + 1.0  # nothing was pulled while the drain held


async def test_a_bad_drain_body_is_refused_and_changes_nothing(nats_server, tiny_checkpoint):
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        reply = await decode.nc.request(drain_subject(REPLICA), b'{"hold_s": -1}', timeout=10.0)
        stats = await decode.stats()
        info = await decode.nc.request(control_subject(ServiceVerb.INFO, SERVICE_NAME), b"", timeout=10.0)
    assert reply.headers["Nats-Service-Error-Code"] == "400"
    assert stats["drains"] == 0 and stats["is_draining"] is False
    endpoints = json.loads(info.data)["endpoints"]
    assert [(e["name"], e["subject"]) for e in endpoints] == [("drain", drain_subject(REPLICA))]


async def test_shutdown_ends_unfinished_requests_with_one_codes_end(nats_server, tiny_checkpoint):
    request = synthesis("at-shutdown", TEXT, frames=1000)  # greedy, no EOS before 1000: far past the shutdown
    async with running_decode(nats_server.url, tiny_checkpoint, runaway_min_frames=1000) as decode:  # grace 0
        await decode.submit(request)
        await decode.log.first_chunk(request.id)
    subject = subjects.codes(subjects.partition_for(request.id, NUM_PARTITIONS), request.id)
    nc = await connect(nats_server.url, "shutdown-check")  # the harness's client closed with the service
    try:
        last = await nc.jetstream().get_last_msg(CODES_STREAM, subject)
        lease = await read_lease(await open_bucket(nc.jetstream()), REPLICA)
    finally:
        await nc.close()
    end = decode_message(last.data, CodesEnd)
    assert end.reason == "failed" and end.error.code == ErrorCode.DRAINED and 0 < end.total_frames < 1000
    assert lease is None  # released on the way out, so nobody waits for a replica that left
