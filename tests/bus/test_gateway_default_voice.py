"""A request that names no voice: on a custom-voice model it gets the model's first speaker, the default that
`GET /v1/audio/voices` names, over HTTP and the WebSocket alike. Real gateway under uvicorn, real nats-server,
stand-in decode/vocoder."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import WS_PATH, receive_until_event
from tests.support.gateway_standin import Plan, expected_pcm

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


async def test_no_voice_means_the_first_speaker_on_http_and_websocket(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway() as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            voices = (await client.get("/v1/audio/voices")).json()
            spoken = await client.post("/v1/audio/speech", json={"input": "No voice given.",
                                                                  "response_format": "pcm"})
        async with websockets.connect(f"ws://127.0.0.1:{port}{WS_PATH}") as socket:
            await socket.send(json.dumps({"input": "No voice here either."}))
            pcm, done = await receive_until_event(socket, "audio.done", "error")
    assert voices["default"] == voices["voices"][0]["id"] == "ryan"
    assert spoken.status_code == 200, spoken.text
    assert spoken.content == expected_pcm(1)
    assert done["type"] == "audio.done" and pcm == expected_pcm(1)
    assert [request.speaker for request in standin.requests] == ["ryan", "ryan"]
