"""The streaming WebSocket protocol on a real uvicorn and a real nats-server, with the scripted decode/vocoder
stand-in (tests/support/gateway_standin.py) for the cases the real mesh cannot set up deterministically: audio that
stops mid-request, a request that stays queued, a terminal published at a chosen moment, a resume window of 0.2 s.
The same behaviours against the real mesh are in test_ws_mesh.py."""

from __future__ import annotations

import time

import pytest
import websockets

from messages import subjects
from messages.audio_format import SAMPLE_RATE
from messages.events import Finished
from services.bus.terminal_guard import publish_terminal
from tests.support.gateway_standin import SAMPLES_PER_FRAME, Plan, expected_pcm
from tests.support.ws_client import ws_connect

pytestmark = pytest.mark.timeout(60)

CHUNK_BYTES = 2 * 2 * SAMPLES_PER_FRAME  # the stand-in's chunks: 2 frames of s16 samples


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}"


async def finish(gateway_bus, request_id: str, chunk_count: int) -> None:
    """End a request the way the vocoder would: its Finished terminal through the guard."""
    frames = 2 * chunk_count
    await publish_terminal(gateway_bus.js, request_id, Finished(
        request_id=request_id, at=time.time(), frames=frames, chunk_count=chunk_count,
        audio_seconds=frames * SAMPLES_PER_FRAME / SAMPLE_RATE))


async def test_sentences_are_synthesized_as_they_arrive_then_flush_and_done(standin, served_gateway):
    standin.plan = Plan(num_chunks=2)
    standin.start_consumer()
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("session.update", voice="ryan", seed=5)
        assert (await client.until("session.updated")).event["session"]["speech"] == {"voice": "ryan", "seed": 5}
        await client.send("input.text", text="Hello there. How")
        first = await client.until("audio.done", "error")  # before any flush or input.done
        await client.send("input.text", text=" are you")
        await client.send("input.flush")
        second = await client.until("audio.done", "error")
        await client.send("input.done")
        done = await client.until("session.done", "error")
        closed = await client.closed()
    starts = [e for e in client.events if e["type"] == "audio.start"]
    assert [(s["segment"], s["text"]) for s in starts] == [(0, "Hello there."), (1, "How are you")]
    assert first.event["type"] == second.event["type"] == "audio.done"
    assert first.pcm == second.pcm == expected_pcm(2)
    assert [r.text for r in standin.requests] == ["Hello there.", "How are you"]
    assert all(r.seed == 5 and r.speaker == "ryan" for r in standin.requests)
    assert done.event["request_ids"] == [s["request_id"] for s in starts]
    assert (done.event["segments"], done.event["samples"]) == (2, 2 * 2 * 2 * SAMPLES_PER_FRAME)
    assert closed.rcvd.code == 1000


async def test_the_next_segment_is_on_the_mesh_while_one_streams_and_plays_after_it(standin, served_gateway,
                                                                                    gateway_bus):
    standin.plan = Plan(num_chunks=1, hang_after=1)  # the first segment stalls after its first chunk
    standin.start_consumer()
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("session.update", voice="ryan")
        await client.send("input.text", text="First one.\n")
        first_start = await client.until("audio.start")
        await client.until(frames=1)
        await standin.wait_acked(1)
        standin.plan = Plan(num_chunks=2)  # the second is served in full at once
        await client.send("input.text", text="Second one.\n")
        await standin.wait_acked(2)  # submitted while the first still streams
        await finish(gateway_bus, first_start.event["request_id"], chunk_count=1)
        first = await client.until("audio.done")
        second = await client.until("audio.done")
    kinds = [e["type"] for e in client.events if e["type"] != "session.updated"]
    assert kinds == ["audio.start", "audio.done", "audio.start", "audio.done"]
    assert first.event["request_id"] == first_start.event["request_id"]
    assert second.pcm == expected_pcm(2) and first.pcm == b""  # its one chunk came before `until("audio.start")`


async def test_base64_format_sends_numbered_audio_delta_events(standin, served_gateway):
    standin.plan = Plan(num_chunks=3, order=(2, 0, 1))
    standin.start_consumer()
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("session.update", voice="ryan", format="pcm_s16le_base64")
        await client.send("input.text", text="Encode me.")
        await client.send("input.flush")
        got = await client.until("audio.done")
    deltas = [e for e in got.events if e["type"] == "audio.delta"]
    assert [d["seq"] for d in deltas] == [0, 1, 2]
    assert got.pcm == expected_pcm(3)
    assert next(e for e in got.events if e["type"] == "audio.start")["format"] == "pcm_s16le_base64"


async def test_bad_messages_get_error_events_and_the_socket_stays_open(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    async with served_gateway() as port, ws_connect(url(port)) as client:
        errors = []
        for bad in ('{"type": "speak"}', "{oops", '{"type": "input.text", "text": 3}', b"\x00\x01"):
            await client.socket.send(bad)
            errors.append((await client.until("error")).event)
        await client.send("session.update", voice="nobody")
        errors.append((await client.until("error")).event)
        await client.send("cancel", request_id="req_unknown")
        errors.append((await client.until("error")).event)
        await client.send("session.update", voice="vivian")
        await client.send("input.text", text="Still here.")
        await client.send("input.done")
        await client.send("input.text", text="Too late.")
        late = await client.until("error")
        standin.start_consumer()  # only now can the segment be served: the refusal came first
        got = await client.until("session.done")
    assert [(e["code"], e["param"]) for e in errors] == [
        ("invalid_value", "type"), ("invalid_json", None), ("invalid_type", "text"),
        ("binary_frame", None), ("unknown_voice", "voice"), ("invalid_request", "request_id")]
    assert "not valid JSON" in errors[1]["message"] and "JSON text" in errors[3]["message"]
    assert got.pcm == expected_pcm(1) and [r.text for r in standin.requests] == ["Still here."]
    assert standin.requests[0].speaker == "vivian"  # the refused update changed nothing
    assert "input.done was sent" in late.event["message"]


async def test_an_oversized_message_closes_the_socket_with_1009(standin, served_gateway):
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("input.text", text="x" * 70_000)
        closed = await client.closed()
    assert closed.rcvd.code == 1009 and "limit" in closed.rcvd.reason
    assert standin.requests == []


async def test_cancel_ends_a_still_queued_request_at_once(standin, served_gateway, gateway_bus):
    # No consumer: the request waits on REQUESTS, where only the gateway can end it.
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("session.update", voice="ryan")
        await client.send("input.text", text="Never mind. And this")
        start = await client.until("audio.start")
        await client.send("cancel")
        error = await client.until("error", "audio.done")
        await client.send("input.flush")  # the buffered "And this" was dropped with the rest
        await client.send("input.text", text="Fresh start.\n")
        fresh = await client.until("audio.start")
    request_id = start.event["request_id"]
    assert (error.event["code"], error.event["request_id"]) == ("cancelled", request_id)
    assert "cancelled by the client" in error.event["message"]
    cancel = await gateway_bus.kv.get(subjects.cancel_key(request_id))
    assert cancel.value
    assert fresh.event["text"] == "Fresh start." and fresh.event["segment"] == 1


async def test_resume_within_the_window_gets_exactly_the_missing_chunks(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=6, hang_after=3)
    standin.start_consumer()
    async with served_gateway(resume_window_s=30.0) as port:
        async with ws_connect(url(port)) as client:
            await client.send("session.update", voice="ryan")
            await client.send("input.text", text="Resume me.\n")
            start = (await client.until("audio.start")).event
            seen = await client.until(frames=3)
        request_id = start["request_id"]
        await finish(gateway_bus, request_id, chunk_count=6)  # it ends while the client is away
        async with ws_connect(url(port)) as client:
            # chunk 2 "got lost" on the way
            await client.send("resume", request_id=request_id, last_seq=1, resume_token=start["resume_token"])
            resumed = await client.until("audio.done", "error")
    again = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (again["request_id"], again["first_seq"], again["resumed"]) == (request_id, 2, True)
    assert seen.pcm == expected_pcm(3)
    assert resumed.frames == [expected_pcm(6)[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES] for i in range(2, 6)]
    assert resumed.event["chunk_count"] == 6 and resumed.event["samples"] == 4 * 2 * SAMPLES_PER_FRAME
    assert [r.from_seq for r in standin.redecodes] == [2]


async def test_a_resume_on_another_gateway_after_its_own_died_gets_exactly_the_missing_chunks(
        standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=6, hang_after=3)
    standin.start_consumer()
    async with served_gateway(resume_window_s=30.0) as port:  # the gateway that streamed it, gone after this block
        async with ws_connect(url(port)) as client:
            await client.send("session.update", voice="ryan")
            await client.send("input.text", text="My gateway dies.\n")
            start = (await client.until("audio.start")).event
            request_id, token = start["request_id"], start["resume_token"]
            seen = await client.until(frames=3)
    await finish(gateway_bus, request_id, chunk_count=6)  # the mesh finishes it meanwhile
    async with served_gateway(resume_window_s=30.0, replica="gateway-heir") as port:  # the same resume secret
        async with ws_connect(url(port)) as client:
            await client.send("resume", request_id=request_id, last_seq=6,
                              resume_token=token)  # a chunk never made: refused, still resumable
            beyond = (await client.until("error", "audio.start")).event
            await client.send("resume", request_id=request_id, last_seq=2, resume_token=token)
            resumed = await client.until("audio.done", "error")
            # delivered in full here now
            await client.send("resume", request_id=request_id, last_seq=2, resume_token=token)
            delivered = (await client.until("error", "audio.start")).event
    again = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (again["request_id"], again["first_seq"], again["resumed"]) == (request_id, 3, True)
    assert seen.pcm + resumed.pcm == expected_pcm(6)
    assert resumed.event["type"] == "audio.done" and resumed.event["chunk_count"] == 6
    assert (beyond["code"], beyond["param"]) == ("out_of_range", "last_seq")
    assert (delivered["code"], delivered["request_id"]) == ("not_resumable", request_id)


async def test_resume_after_the_window_is_refused_with_a_clear_error(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=6, hang_after=2)
    standin.start_consumer()
    async with served_gateway(resume_window_s=0.2) as port:
        async with ws_connect(url(port)) as client:
            await client.send("session.update", voice="ryan")
            await client.send("input.text", text="Too slow.\n")
            start = (await client.until("audio.start")).event
            request_id = start["request_id"]
            await client.until(frames=2)
        watcher = await gateway_bus.kv.watch(subjects.cancel_key(request_id), ignore_deletes=True)
        async for entry in watcher:  # the supervisor writes it once the window has passed
            if entry is not None:
                break
        await watcher.stop()
        async with ws_connect(url(port)) as client:
            await client.send("resume", request_id=request_id, last_seq=1, resume_token=start["resume_token"])
            refused = (await client.until("error", "audio.start")).event
            await client.send("resume", request_id="req_never_seen", resume_token=start["resume_token"])
            unknown = (await client.until("error", "audio.start")).event
    assert (refused["type"], refused["code"], refused["request_id"]) == ("error", "cancelled", request_id)
    assert "past the 0.2s resume window" in refused["message"]
    assert unknown["code"] == "not_resumable" and "not resumable" in unknown["message"]


async def test_a_browser_passes_its_api_key_as_a_subprotocol(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway(api_keys="k-one") as port:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with ws_connect(url(port), subprotocols=["voxmesh", "bearer.wrong"]):
                pass
        assert refused.value.response.status_code == 403  # closed (1008) before the handshake completed
        async with ws_connect(url(port), subprotocols=["voxmesh", "bearer.k-one"]) as client:
            assert client.socket.subprotocol == "voxmesh"
            await client.send("session.update", voice="eric")
            await client.send("input.text", text="Let me in.\n")
            got = await client.until("audio.done", "error")
    assert got.event["type"] == "audio.done" and got.pcm == expected_pcm(1)
