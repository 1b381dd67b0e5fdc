"""WebSocket /v1/audio/speech/stream on a real uvicorn (127.0.0.1, free port) with the `websockets` client,
real nats-server, stand-in decode/vocoder."""

from __future__ import annotations

import json

import pytest
import websockets

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.errors import ErrorCode, Stage
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import WS_PATH as PATH
from tests.support.gateway_fixtures import receive_until_event
from tests.support.gateway_standin import Plan, expected_pcm

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

async def test_streams_pcm_frames_in_order_then_audio_done(standin, served_gateway):
    standin.plan = Plan(num_chunks=4, order=(1, 0, 3, 2))
    standin.start_consumer()
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "Stream me.", "voice": "ryan"}))
        start = json.loads(await socket.recv())
        assert (start["type"], start["format"], start["sample_rate"]) == ("audio.start", "pcm_s16le", SAMPLE_RATE)
        frames = []
        while isinstance(message := await socket.recv(), bytes):
            frames.append(message)
        done = json.loads(message)
    assert b"".join(frames) == expected_pcm(4)
    assert len(frames) == 4  # one binary frame per chunk, none twice
    assert done == {"type": "audio.done", "request_id": start["request_id"], "chunk_count": 4,
                    "samples": 4 * 2 * SAMPLES_PER_FRAME, "duration_s": 4 * 2 * SAMPLES_PER_FRAME / SAMPLE_RATE,
                    "frames": 8, "stop": "eos"}
    assert standin.requests[0].id == start["request_id"]


async def test_dropped_chunk_is_repaired_on_the_socket(standin, served_gateway):
    standin.plan = Plan(num_chunks=3, drop=frozenset({0}))
    standin.start_consumer()
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "Repair me.", "voice": "ryan"}))
        pcm, done = await receive_until_event(socket, "audio.done", "error")
    assert done["type"] == "audio.done" and pcm == expected_pcm(3)
    assert [r.from_seq for r in standin.redecodes] == [0]


async def test_failure_mid_stream_sends_the_audio_so_far_then_the_error(standin, served_gateway):
    standin.plan = Plan(num_chunks=5, fail_after=2, failure=(ErrorCode.CAPACITY, Stage.DECODE))
    standin.start_consumer()
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "Fail halfway.", "voice": "ryan"}))
        pcm, error = await receive_until_event(socket, "audio.done", "error")
    assert pcm == expected_pcm(2)
    assert (error["type"], error["code"], error["stage"]) == ("error", "capacity", "decode")
    assert error["request_id"] == standin.requests[0].id


async def test_bad_messages_get_error_events_and_the_socket_stays_open(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send("{not json")
        malformed = json.loads(await socket.recv())
        await socket.send(json.dumps({"input": 7, "voice": "ryan"}))
        wrong_type = json.loads(await socket.recv())
        await socket.send(json.dumps({"input": "hi", "voice": "nobody"}))
        unknown_voice = json.loads(await socket.recv())
        await socket.send(json.dumps({"input": "", "voice": "ryan"}))
        empty = json.loads(await socket.recv())
        await socket.send(b"\x00\x01")
        binary = json.loads(await socket.recv())
        await socket.send(json.dumps({"input": "Still here.", "voice": "ryan"}))
        pcm, done = await receive_until_event(socket, "audio.done", "error")
    assert (malformed["type"], malformed["code"]) == ("error", "invalid_json")
    assert "not valid JSON" in malformed["message"]
    assert (wrong_type["code"], wrong_type["param"]) == ("invalid_type", "input")
    assert (unknown_voice["code"], unknown_voice["param"]) == ("unknown_voice", "voice")
    assert unknown_voice["request_id"] is None  # refused before it had an id: nothing was queued
    assert empty["code"] == "empty_input" and "input is empty" in empty["message"]
    assert binary["code"] == "binary_frame" and "JSON text" in binary["message"]
    assert done["type"] == "audio.done" and pcm == expected_pcm(1)
    assert len(standin.requests) == 1


async def test_several_requests_on_one_socket_are_served_in_turn(standin, served_gateway):
    standin.plan = Plan(num_chunks=2)
    standin.start_consumer()
    async with served_gateway() as port, websockets.connect(f"ws://127.0.0.1:{port}{PATH}") as socket:
        await socket.send(json.dumps({"input": "One.", "voice": "ryan"}))
        await socket.send(json.dumps({"input": "Two.", "voice": "vivian"}))
        first = await receive_until_event(socket, "audio.done", "error")
        second = await receive_until_event(socket, "audio.done", "error")
    assert first[0] == second[0] == expected_pcm(2)
    assert first[1]["request_id"] != second[1]["request_id"]
    assert [r.text for r in standin.requests] == ["One.", "Two."]


async def test_api_keys_are_checked_before_the_socket_is_accepted(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway(api_keys="k-one, k-two") as port:
        url = f"ws://127.0.0.1:{port}{PATH}"
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(url, additional_headers={"Authorization": "Bearer wrong"}):
                pass
        assert refused.value.response.status_code == 403
        async with websockets.connect(url, additional_headers={"Authorization": "Bearer k-two"}) as socket:
            await socket.send(json.dumps({"input": "Let me in.", "voice": "ryan"}))
            pcm, done = await receive_until_event(socket, "audio.done", "error")
    assert done["type"] == "audio.done" and pcm == expected_pcm(1)
