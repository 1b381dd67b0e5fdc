"""Admission: every bad body gets a 400 naming the field and a specific code, and nothing reaches the queue;
a full queue gets a 429 with Retry-After. Real nats-server, real HTTP through the ASGI app."""

from __future__ import annotations

import time

import pytest

from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM
from services.bus.submit import submit_request
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, gateway_factory...)
from tests.support.gateway_standin import MODEL, Plan

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

BAD_BODIES = [
    # (body, code, param, words the message must contain)
    ({"input": "", "voice": "ryan"}, "empty_input", "input", "input is empty"),
    ({"input": "   \n", "voice": "ryan"}, "empty_input", "input", "input is empty"),
    ({"input": "x" * 4097, "voice": "ryan"}, "text_too_long", "input", "4097 characters; the limit is 4096"),
    ({"input": "hi", "voice": "alloy"}, "unknown_voice", "voice", "ryan, vivian, eric"),
    ({"input": "hi", "voice": "ryan", "language": "klingon"}, "unknown_language", "language", "english"),
    ({"input": "hi", "voice": "ryan", "language": "sichuan_dialect"}, "unknown_language", "language", "auto"),
    ({"input": "hi", "voice": "ryan", "model": "gpt-4o-mini-tts"}, "unknown_model", "model", "'tiny'"),
    ({"input": 42, "voice": "ryan"}, "invalid_type", "input", "Expected `str`, got `int`"),
    ({"input": "hi", "voice": ["ryan"]}, "invalid_type", "voice", "got `array`"),
    ({"input": "hi", "voice": "ryan", "seed": True}, "invalid_type", "seed", "got `bool`"),
    ({"input": "hi", "voice": "ryan", "seed": -1}, "out_of_range", "seed", ">= 0"),
    ({"input": "hi", "voice": "ryan", "temperature": "hot"}, "invalid_type", "temperature", "got `str`"),
    ({"input": "hi", "voice": "ryan", "temperature": -0.5}, "out_of_range", "temperature", ">= 0.0"),
    ({"input": "hi", "voice": "ryan", "top_p": 1.5}, "out_of_range", "top_p", "<= 1.0"),
    ({"input": "hi", "voice": "ryan", "max_new_tokens": 0}, "out_of_range", "max_new_tokens", ">= 1"),
    # Beyond 64 bits an integer cannot travel on the bus: refused here, not a 500 later.
    ({"input": "hi", "voice": "ryan", "max_new_tokens": 10**30}, "out_of_range", "max_new_tokens", "<= 2147483647"),
    ({"input": "hi", "voice": "ryan", "top_k": 2**64}, "out_of_range", "top_k", "<= 2147483647"),
    ({"input": "hi", "voice": "ryan", "text_mode": "chunky"}, "invalid_value", "text_mode", "'chunky'"),
    ({"input": "hi", "voice": "ryan", "temprature": 0.5}, "unknown_field", "temprature", "unknown field"),
    ({"input": "hi", "voice": "ryan", "response_format": "aiff"}, "unsupported_format", "response_format",
     "wav, pcm, flac, mp3, opus, aac, ulaw, alaw"),
    ({"input": "hi", "voice": "ryan", "speed": 2.0}, "unsupported_value", "speed", "no speed control"),
    ({"input": "hi", "voice": "ryan", "speed": 5.0}, "out_of_range", "speed", "0.25..4.0"),
    ({"voice": "ryan"}, "missing_field", "input", "missing required field `input`"),
    (["hi"], "invalid_type", None, "Expected `object`, got `array`"),
]


async def queued_requests(gateway_bus) -> int:
    return (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages


@pytest.mark.parametrize(("body", "code", "param", "words"), BAD_BODIES, ids=[f"{c}-{p}-{i}" for i, (_, c, p, _)
                                                                                in enumerate(BAD_BODIES)])
async def test_bad_body_is_a_specific_400(gateway_factory, gateway_bus, body, code, param, words):
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert words in error["message"]
    assert await queued_requests(gateway_bus) == 0


async def test_malformed_json_is_a_400(gateway_factory, gateway_bus):
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", content=b'{"input": "hi", "voice": ',
                                     headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and "not valid JSON" in error["message"]
    assert await queued_requests(gateway_bus) == 0


async def test_text_limit_is_a_setting(gateway_factory):
    async with gateway_factory(max_text_chars=10) as client:
        response = await client.post("/v1/audio/speech", json={"input": "eleven char", "voice": "ryan"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "text_too_long"
    assert "the limit is 10" in response.json()["error"]["message"]


async def test_names_are_case_insensitive_and_the_limit_is_inclusive(standin, gateway_factory):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "x" * 4096, "voice": "RYAN",
                                                                "language": "Japanese", "model": "TINY"})
    assert response.status_code == 200, response.text
    assert (standin.requests[0].speaker, standin.requests[0].language) == ("ryan", "japanese")


@pytest.mark.parametrize("bus_overrides", [{"max_queued_requests": 2}])
async def test_full_queue_is_a_429_with_retry_after(standin, gateway_factory, gateway_bus):
    for index in range(2):  # fill REQUESTS (bound 2) while no decode replica pulls
        await submit_request(gateway_bus.js, SynthesisRequest(id=f"filler{index}", model=MODEL, text="filler",
                                                              speaker="ryan", created_at=time.time()))
    async with gateway_factory(retry_after_s=3) as client:
        refused = await client.post("/v1/audio/speech", json={"input": "One too many.", "voice": "ryan"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("queue_full", "rate_limit_error")
        assert await queued_requests(gateway_bus) == 2

        standin.plan = Plan(num_chunks=1)
        standin.start_consumer()  # the queue drains: the next request is served
        await standin.wait_acked(2)
        served = await client.post("/v1/audio/speech", json={"input": "Room now.", "voice": "ryan"})
    assert served.status_code == 200, served.text
