"""G.711 answers over real HTTP and the WebSocket (the gateway under uvicorn, the stand-in decode and vocoder on a
real nats-server): `response_format` ulaw and alaw, whole, streamed and as SSE, and the socket's `pcm_mulaw` and
`pcm_alaw`, are the same 8 kHz bytes, with their media types and rate, and decode (with the tests' own G.711
tables) to the whole signal resampled by libsoxr, within companding."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import soxr

from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import standin_http_client
from tests.support.gateway_standin import Plan, expected_pcm
from tests.support.http_client import parse_sse, sse_audio
from tests.support.g711_tables import decode
from tests.support.ws_client import ws_connect

pytestmark = pytest.mark.timeout(60)

CHUNKS = 6
MEDIA_TYPES = {"ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}


@pytest.fixture
async def client(standin, served_gateway):
    async with standin_http_client(standin, served_gateway, CHUNKS) as http:
        yield http


async def speak(client: httpx.AsyncClient, **fields) -> httpx.Response:
    return await client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": "ryan", **fields})


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
async def test_g711_whole_streamed_and_sse_are_the_same_8_khz_bytes(client, law):
    whole = await speak(client, response_format=law)
    async with client.stream("POST", "/v1/audio/speech", json={"input": "Hello there.", "response_format": law,
                                                               "stream": True}) as streaming:
        streamed = b"".join([piece async for piece in streaming.aiter_raw()])
    events = await speak(client, response_format=law, stream_format="sse")
    for response in (whole, streaming):
        assert response.status_code == 200
        assert response.headers["content-type"] == MEDIA_TYPES[law]
        assert (response.headers["x-sample-rate"], response.headers["x-bit-depth"], response.headers["x-channels"]) \
            == ("8000", "8", "1")
    assert whole.headers["content-length"] == str(len(whole.content)) and "content-length" not in streaming.headers
    assert streamed == whole.content == sse_audio(parse_sse(events.text))
    pcm = np.frombuffer(expected_pcm(CHUNKS), dtype="<i2")
    reference = soxr.resample(pcm.astype(np.float32) / 32768, 24000, 8000, quality="HQ") * 32768
    decoded = decode(whole.content, law)
    assert len(decoded) == len(pcm) // 3
    assert (np.abs(decoded - reference) <= np.maximum(np.abs(reference) * 0.06, 16)).all()


@pytest.mark.parametrize(("ws_format", "law"), [("pcm_mulaw", "ulaw"), ("pcm_alaw", "alaw")])
async def test_websocket_g711_formats_send_the_bytes_of_the_http_answer(standin, served_gateway, ws_format, law):
    standin.plan = Plan(num_chunks=CHUNKS)
    standin.start_consumer()
    async with served_gateway() as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            whole = await speak(http, response_format=law)
        async with ws_connect(f"ws://127.0.0.1:{port}") as client:
            await client.send("session.update", voice="ryan", format=ws_format)
            await client.until("session.updated")
            await client.send("input.text", text="Hello there.")
            await client.send("input.done")
            got = await client.until("audio.done", "error")
            await client.until("session.done", "error")
    (start,) = [event for event in got.events if event["type"] == "audio.start"]
    assert (start["format"], start["sample_rate"]) == (ws_format, 8000)
    assert got.event["type"] == "audio.done" and got.event["chunk_count"] == CHUNKS
    assert len(got.frames) == CHUNKS + 1  # one frame a chunk, then the resampling filter's tail
    assert got.pcm == whole.content  # the same 8 kHz G.711 bytes as a whole HTTP answer
