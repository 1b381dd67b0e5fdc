"""The bad-input catalog over real HTTP (gateway under uvicorn, real nats-server): each bad body gets its specific
code, nothing reaches the queue, and a healthy request served beside it gets exactly its undisturbed audio."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import Plan, expected_pcm

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

NESTING = 100_000

BAD_INPUTS = [
    # (raw body, status, code, words the message must contain)
    (b'{"input": "\xff\xfe caf\xe9"}', 400, "invalid_json", "Invalid UTF-8"),
    (json.dumps({"input": "Hello\x00 there."}).encode(), 400, "control_characters", "U+0000"),
    (json.dumps({"input": "Red \x1b[31malert."}).encode(), 400, "control_characters", "U+001B"),
    (json.dumps({"input": "?!... --- ;)"}).encode(), 400, "nothing_to_say", "no letter or digit"),
    (json.dumps({"input": "\U0001F600\U0001F389 \u2764"}).encode(), 400, "nothing_to_say", "emoji"),
    (b'{"input": "hi", "voice": ' + b"[" * NESTING + b"]" * NESTING + b"}", 400, "invalid_type", "got `array`"),
    (b'{"input": "hi", "voice": "ryan"' + b"}" * NESTING, 400, "invalid_json", "not valid JSON"),
    (json.dumps({"input": "x" * (10 * 1024 * 1024)}).encode(), 400, "text_too_long", "10485760 characters"),
]


async def test_each_bad_input_gets_its_code_and_a_healthy_request_beside_is_undisturbed(standin, served_gateway,
                                                                                       gateway_bus):
    standin.plan = Plan(num_chunks=3)
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                                           timeout=30) as client:
        healthy = asyncio.ensure_future(client.post("/v1/audio/speech", json={"input": "Undisturbed, please.",
                                                                               "response_format": "pcm"}))
        refused = [await client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
                   for raw, *_ in BAD_INPUTS]
        served = await healthy
    for response, (_, status, code, words) in zip(refused, BAD_INPUTS):
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == (status, code), error
        assert words in error["message"] and error["request_id"] == response.headers["x-request-id"]
    assert served.status_code == 200 and served.content == expected_pcm(3)
    assert [request.text for request in standin.requests] == ["Undisturbed, please."]  # nothing else was queued


async def test_tab_and_line_breaks_are_speakable_text(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        response = await client.post("/v1/audio/speech", json={"input": "One,\ttwo.\r\nThree 三.",
                                                                "response_format": "pcm"})
    assert response.status_code == 200, response.text
