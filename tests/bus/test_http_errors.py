"""What the official `openai` client sees when voxmesh refuses a request: OpenAI's error shape, a specific code and a
message naming the problem for every case of the API; 429 with Retry-After; API keys; X-Request-Id on every
response. Real gateway under uvicorn, real nats-server."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest

from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM
from services.bus.submit import submit_request
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import gateway_app, gateway_settings
from tests.support.gateway_standin import MODEL, Plan
from tests.support.http_client import openai_client

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

REQUEST_ID = re.compile(r"^req_[A-Za-z0-9_-]{22}$")

# (what the client passes to speech.create, code, param, words the message must contain)
ERROR_CASES = [
    ({"input": ""}, "empty_input", "input", "input is empty"),
    ({"input": "x" * 4097}, "text_too_long", "input", "the limit is 4096"),
    ({"voice": "alloy"}, "unknown_voice", "voice", "ryan, vivian, eric"),
    ({"model": "gpt-4o-mini-tts"}, "unknown_model", "model", "this gateway serves 'tiny'"),
    ({"response_format": "aiff"}, "unsupported_format", "response_format", "use one of wav, pcm, flac, mp3, opus, aac"),
    ({"extra_body": {"language": "klingon"}}, "unknown_language", "language", "auto, english"),
    ({"extra_body": {"top_p": 1.5}}, "out_of_range", "top_p", "<= 1.0"),
    ({"speed": 5.0}, "out_of_range", "speed", "outside 0.25..4.0"),
    ({"speed": 1.5}, "unsupported_value", "speed", "no speed control"),
    ({"extra_body": {"seed": "seven"}}, "invalid_type", "seed", "got `str`"),
    ({"extra_body": {"input": 42}}, "invalid_type", "input", "Expected `str`, got `int`"),
    ({"extra_body": {"text_mode": "chunky"}}, "invalid_value", "text_mode", "'chunky'"),
    ({"stream_format": "video"}, "invalid_value", "stream_format", "'video'"),
    ({"extra_body": {"temprature": 0.3}}, "unknown_field", "temprature", "unknown field"),
    ({"extra_body": {"max_new_tokens": 4, "min_new_tokens": 9}}, "out_of_range", "min_new_tokens",
     "min_new_tokens (9) is above max_new_tokens (4)"),
]


async def queued(gateway_bus) -> int:
    return (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages


@pytest.mark.parametrize(("fields", "code", "param", "words"), ERROR_CASES,
                         ids=[f"{code}-{param}" for _, code, param, _ in ERROR_CASES])
async def test_each_bad_request_gets_its_code_and_message(served_gateway, gateway_bus, fields, code, param, words):
    call = {"model": "tiny", "voice": "ryan", "input": "Hello.", **fields}
    async with served_gateway() as port:
        async with openai_client(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.audio.speech.create(**call)
    error = refused.value
    assert (error.status_code, error.code, error.param, error.type) == (400, code, param, "invalid_request_error")
    assert words in error.message
    assert REQUEST_ID.match(error.request_id) and error.body["request_id"] == error.request_id
    assert await queued(gateway_bus) == 0  # nothing reached the mesh


@pytest.mark.parametrize(("raw", "code", "words"), [
    (b'{"input": "hi", "voice": ', "invalid_json", "not valid JSON"),
    (b'["hi"]', "invalid_type", "Expected `object`, got `array`"),
    (b'{"voice": "ryan"}', "missing_field", "missing required field `input`"),
])
async def test_malformed_bodies_get_their_codes(served_gateway, raw, code, words):
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        response = await client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, code) and words in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize("bus_overrides", [{"max_queued_requests": 1}])
async def test_overload_is_a_rate_limit_error_with_retry_after(standin, served_gateway, gateway_bus):
    await submit_request(gateway_bus.js, SynthesisRequest(id="filler", model=MODEL, text="filler", speaker="ryan",
                                                          created_at=time.time()))
    async with served_gateway(retry_after_s=4) as port:
        async with openai_client(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(openai.RateLimitError) as refused:
                await client.audio.speech.create(model="tiny", voice="ryan", input="One too many.")
    error = refused.value
    assert (error.status_code, error.code, error.type) == (429, "queue_full", "rate_limit_error")
    assert error.response.headers["retry-after"] == "4" and "retry in 4s" in error.message


async def test_api_keys_are_enforced_without_saying_what_was_wrong(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway(api_keys="key-one,key-two") as port:
        base = f"http://127.0.0.1:{port}"
        refusals = []
        for key in ("key-three", "key-one-", "key"):
            async with openai_client(base, api_key=key) as client:
                with pytest.raises(openai.AuthenticationError) as refused:
                    await client.audio.speech.create(model="tiny", voice="ryan", input="Hi.")
            refusals.append(refused.value)
        async with httpx.AsyncClient(base_url=base) as client:
            no_header = await client.get("/v1/models")
            basic = await client.get("/v1/audio/voices", headers={"Authorization": "Basic a2V5LW9uZQ=="})
            open_paths = [await client.get("/health")]
            metrics = await client.get("/metrics")  # no admin keys: the operator's route takes a client key
        async with openai_client(base, api_key="key-two") as client:
            served = await client.audio.speech.create(model="tiny", voice="ryan", input="Hi.", response_format="pcm")
        async with openai_client(base, api_key="key-one") as client:
            models = await client.models.list()
    bodies = [{**error.body, "request_id": None} for error in refusals]
    bodies += [{**response.json()["error"], "request_id": None} for response in (no_header, basic)]
    assert all(body == bodies[0] for body in bodies)  # one answer, whatever was wrong
    assert bodies[0]["code"] == "invalid_api_key" and no_header.status_code == basic.status_code == 401
    assert no_header.headers["www-authenticate"] == "Bearer"
    assert all(response.status_code == 200 for response in open_paths)
    assert metrics.status_code == 401
    assert served.content and [model.id for model in models.data] == ["tiny"]
    assert len(standin.requests) == 1


async def test_every_response_carries_its_own_request_id(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        responses = [
            await client.post("/v1/audio/speech", json={"input": "Fine.", "voice": "ryan"}),
            await client.post("/v1/audio/speech", json={"input": "", "voice": "ryan"}),
            await client.get("/v1/audio/speech"),  # wrong method
            await client.get("/no/such/path"),
            await client.get("/health"),
            await client.get("/ready"),
            await client.get("/metrics"),
            await client.get("/v1/models"),
            await client.get("/v1/models/gpt-4o"),
            await client.get("/v1/audio/voices"),
        ]
    ids = [response.headers.get("x-request-id", "") for response in responses]
    assert all(REQUEST_ID.match(request_id) for request_id in ids), ids
    assert len(set(ids)) == len(ids)
    assert ids[0] == standin.requests[0].id  # the speech request ran under the id its answer names
    statuses = [response.status_code for response in responses]
    assert statuses[5] in (200, 503)  # /ready: 503 when a loaded machine let the stand-in's short leases lapse
    assert statuses[:5] + statuses[6:] == [200, 400, 405, 404, 200, 200, 200, 404, 200]
    for response in responses[1:4] + responses[8:9]:  # every error in OpenAI's shape, naming the same id
        error = response.json()["error"]
        assert error["request_id"] == response.headers["x-request-id"] and error["type"] == "invalid_request_error"
    assert (responses[3].json()["error"]["code"], responses[8].json()["error"]["code"]) == ("not_found",
                                                                                             "unknown_model")


async def test_a_bug_is_an_openai_shaped_500_with_the_request_id(gateway_bus, gateway_model_dir):
    async def broken() -> None:
        raise RuntimeError("internal detail that must not leak")

    async with gateway_app(gateway_settings(gateway_bus, gateway_model_dir)) as app:
        app.add_api_route("/v1/broken", broken)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # as a server: answer, then log
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            response = await client.get("/v1/broken")
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["type"]) == (500, "internal", "server_error")
    request_id = response.headers["x-request-id"]
    assert REQUEST_ID.match(request_id) and error["request_id"] == request_id
    assert "RuntimeError" in error["message"] and "must not leak" not in error["message"]
