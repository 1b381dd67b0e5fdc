"""The gateway's supervisor on a real nats-server: queue deadline (timeout), end-to-end deadline (timeout), poison (MaxDeliver advisory), a lost
vocoder (replica_lost), the resume window (cancel), standing down when another stage ended the request, and a dead
decode owner's request requeued for a takeover (migration)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import msgspec
import pytest
import websockets

from messages import decode, subjects
from messages.events import Failed, Finished, TerminalEvent
from messages.requests import SynthesisRequest
from messages.streams import EVENTS_STREAM, REQUESTS_STREAM, lane_consumer
from services.bus.claims import claim_request, read_owner
from services.bus.leases import LeaseKeeper
from services.bus.terminal_guard import publish_terminal
from services.gateway.requests.supervisor import Supervisor, SupervisorPolicy
from services.gateway.requests.terminal_feed import TerminalFeed
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import WS_PATH as PATH
from tests.support.gateway_fixtures import receive_until_event
from tests.support.gateway_standin import MODEL, Plan, expected_pcm
from tests.support.http_client import next_cancel

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


async def terminals_of(gateway_bus, request_id: str) -> tuple[int, TerminalEvent | None]:
    """How many terminal events EVENTS holds for the request (the guard allows one), and the last of them."""
    subject = subjects.terminal(request_id)
    info = await gateway_bus.js.stream_info(EVENTS_STREAM, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    if not count:
        return 0, None
    return count, decode((await gateway_bus.js.get_last_msg(EVENTS_STREAM, subject)).data, TerminalEvent)


async def test_request_queued_past_its_deadline_fails_with_timeout(standin, gateway_factory, gateway_bus):
    # No consumer: the request stays on REQUESTS until the supervisor's deadline check ends it.
    async with gateway_factory(request_deadline_s=0.3) as client:
        started = time.monotonic()
        response = await client.post("/v1/audio/speech", json={"input": "Nobody home.", "voice": "ryan"})
    assert time.monotonic() - started >= 0.3
    assert response.status_code == 504
    error = response.json()["error"]
    assert (error["code"], error["stage"]) == ("timeout", "gateway")
    assert "no decode replica took it" in error["message"]
    request_id = response.headers["x-request-id"]
    count, terminal = await terminals_of(gateway_bus, request_id)
    assert count == 1 and isinstance(terminal, Failed) and terminal.code == "timeout"
    assert (await next_cancel(gateway_bus.kv, request_id)).code == "timeout"
    assert (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages == 0  # its queue slot is free


@pytest.mark.parametrize("bus_overrides", [{"request_max_deliver": 2}])
async def test_request_that_exhausts_max_deliver_fails_as_poison(standin, gateway_factory, gateway_bus):
    standin.plan = Plan(consume="nak")  # every delivery fails, as if the request crashed decode
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Poison.", "voice": "ryan"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["code"], error["stage"]) == ("poison", "decode")
    assert "2 times" in error["message"]
    assert len(standin.requests) == 2  # delivered exactly MaxDeliver times
    count, terminal = await terminals_of(gateway_bus, response.headers["x-request-id"])
    assert count == 1 and terminal.code == "poison"
    assert (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages == 0


async def test_lost_vocoder_fails_the_request_after_the_audio_so_far(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=5, hang_after=2)  # two chunks, then the vocoder goes silent
    standin.start_consumer()
    async with served_gateway(vocoder_grace_s=0.3, request_deadline_s=55.0) as port, \
            websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "Vocoder dies.", "voice": "ryan"}))
        start = json.loads(await socket.recv())
        first_two = [await socket.recv(), await socket.recv()]
        standin.kill_vocoder()  # its lease lapses (ttl 0.5s); nobody re-claims the partition
        killed_at = time.monotonic()
        pcm, error = await receive_until_event(socket, "audio.done", "error")
    # Failing it must not wait for its queue deadline (its queue slot is long gone: freeing it again is no error).
    assert time.monotonic() - killed_at < 30.0
    assert b"".join(first_two) + pcm == expected_pcm(2)
    assert (error["code"], error["stage"]) == ("replica_lost", "vocoder")
    assert "vocoder-standin" in error["message"] and "lost its lease" in error["message"]
    count, terminal = await terminals_of(gateway_bus, start["request_id"])
    assert count == 1
    assert (terminal.code, terminal.stage, terminal.chunk_count, terminal.frames) == (
        "replica_lost", "vocoder", 2, 4)


async def test_request_that_no_stage_ends_times_out_with_one_terminal(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=5, hang_after=1)  # claimed, one chunk, then silence: no stage ever ends it
    standin.start_consumer()
    async with served_gateway(request_timeout_s=0.5) as port, \
            websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "Nobody ends this.", "voice": "ryan"}))
        start = json.loads(await socket.recv())
        first = await socket.recv()
        pcm, error = await receive_until_event(socket, "audio.done", "error")
    assert first + pcm == expected_pcm(1)
    assert (error["code"], error["stage"]) == ("timeout", "gateway")
    assert "--request-timeout-s" in error["message"]
    request_id = start["request_id"]
    count, terminal = await terminals_of(gateway_bus, request_id)
    assert count == 1 and isinstance(terminal, Failed) and (terminal.code, terminal.chunk_count) == ("timeout", 1)
    assert time.time() - terminal.at < 10 and terminal.at - standin.requests[0].created_at >= 0.5
    assert (await next_cancel(gateway_bus.kv, request_id)).code == "timeout"  # every stage stops its work


async def test_client_gone_past_the_resume_window_cancels_the_request(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=5, hang_after=1)
    standin.start_consumer()
    async with served_gateway(resume_window_s=0.2) as port:
        async with websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
            await socket.send(json.dumps({"input": "Goodbye.", "voice": "ryan"}))
            request_id = json.loads(await socket.recv())["request_id"]
            await socket.recv()  # the first chunk; then the client leaves
        left = time.time()
        cancel = await asyncio.wait_for(next_cancel(gateway_bus.kv, request_id), 10)
    assert cancel.code == "cancelled" and "did not resume" in cancel.reason
    assert cancel.at - left >= 0.2 - 0.05  # not before the window (clock granularity aside)


async def test_supervisor_stands_down_when_another_stage_ended_the_request(gateway_bus):
    supervisor = Supervisor(gateway_bus.nc, gateway_bus.js, gateway_bus.kv, MODEL, TerminalFeed(gateway_bus.js),
                            SupervisorPolicy(check_interval_s=0.05))
    request = SynthesisRequest(id="raced", model=MODEL, text="race", speaker="ryan", deadline=time.time() - 1,
                               created_at=time.time() - 2)
    supervisor.watch(request, partition=0, queue_seq=None, stream=None)
    finished = Finished(request_id="raced", at=time.time(), frames=4, audio_seconds=0.32, chunk_count=2)
    assert await publish_terminal(gateway_bus.js, "raced", finished)
    await supervisor.check(time.time())  # past the deadline and unclaimed: it tries to fail it, and loses
    assert not supervisor.is_watching("raced")
    count, terminal = await terminals_of(gateway_bus, "raced")
    assert count == 1 and isinstance(terminal, Finished)


async def test_http_client_hanging_up_cancels_the_request_after_the_window(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=5, hang_after=1)
    standin.start_consumer()
    async with served_gateway(resume_window_s=0.2) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            post = asyncio.create_task(client.post("/v1/audio/speech", json={"input": "Bye.", "voice": "ryan"}))
            await standin.wait_acked(1)  # the request is in flight
            post.cancel()  # the client hangs up
            with contextlib.suppress(asyncio.CancelledError):
                await post
        cancel = await asyncio.wait_for(next_cancel(gateway_bus.kv, standin.requests[0].id), 10)
    assert cancel.code == "cancelled" and "did not resume within 0.2s" in cancel.reason


async def test_a_request_whose_decode_owner_died_is_requeued_once_for_a_takeover(standin, served_gateway,
                                                                                gateway_bus):
    # The test plays decode: a replica claims the request, sends two chunks and dies (it never held a lease).
    # The request's lane: an anonymous interactive request's.
    durable = lane_consumer(MODEL, "interactive", subjects.tenant_lane(""))
    pull = await gateway_bus.js.pull_subscribe_bind(durable=durable, stream=REQUESTS_STREAM)
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "My decode replica dies.", "voice": "ryan", "seed": 9}))
        start = json.loads(await socket.recv())
        [first] = await pull.fetch(1, timeout=10)
        request = decode(first.data, SynthesisRequest)
        await claim_request(gateway_bus.kv, request.id, "decode-dying")
        await first.ack_sync()
        for seq in (0, 1):
            await standin.publish_chunk(request.id, seq, Plan())
        [again] = await pull.fetch(1, timeout=10)  # the supervisor saw the dead owner and requeued the request
        requeued = decode(again.data, SynthesisRequest)
        # The heir (a live replica) takes the claim over and finishes the request.
        await LeaseKeeper(gateway_bus.kv, "decode-heir", "decode", ttl_s=30.0).renew()
        await claim_request(gateway_bus.kv, request.id, "decode-heir",
                            current=await read_owner(gateway_bus.kv, request.id))
        await again.ack_sync()
        for seq in (2, 3, 4):
            await standin.publish_chunk(request.id, seq, Plan())
        await publish_terminal(gateway_bus.js, request.id, Finished(request_id=request.id, at=time.time(), frames=10,
                                                                    chunk_count=5, audio_seconds=0.8))
        pcm, done = await receive_until_event(socket, "audio.done", "error")
        queued_after = (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages
    assert start["request_id"] == request.id and done["type"] == "audio.done", done
    assert pcm == expected_pcm(5), "every chunk once, in order, across the takeover"
    assert again.headers["Nats-Msg-Id"] == f"{request.id}:requeue:e1"
    assert msgspec.structs.replace(request, deadline=None) == requeued, "the same request, without its deadline"
    assert queued_after == 0, "requeued once: the live heir is left alone"
    count, terminal = await terminals_of(gateway_bus, request.id)
    assert count == 1 and isinstance(terminal, Finished)
