"""A long HTTP input is spoken whole: split at sentence ends into ordered requests (segments), their audio one
response. Splitting rules on their own; then a real gateway under uvicorn with the stand-in decode/vocoder: the
segments reach the mesh in order under ids derived from the HTTP request's, and a failed segment fails the
response with its code and cancels the rest."""

from __future__ import annotations

import base64

import httpx
import pytest

from messages.errors import ErrorCode, Stage
from services.gateway.http.segmented_speech import segment_id, split_for_speech
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import Plan, expected_pcm
from tests.support.http_client import parse_sse

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

SENTENCES = [f"Sentence number {index} says a few words about the weather." for index in range(80)]
LONG_TEXT = " ".join(SENTENCES)  # ~4,700 characters: more than the limit, so tests cut it to 4,096


def test_short_text_is_one_segment_and_long_text_splits_at_sentence_ends():
    assert split_for_speech("Hello there. How are you?", 400) == ["Hello there. How are you?"]
    segments = split_for_speech(LONG_TEXT, 400)
    assert " ".join(segments) == LONG_TEXT  # nothing lost, order kept
    assert all(len(segment) <= 400 for segment in segments) and len(segments) == 12
    assert all(segment.endswith("weather.") for segment in segments)  # cut at sentence ends only
    assert split_for_speech("word " * 200, 100)[0] == ("word " * 20).strip()  # one long sentence: cut at a space
    cjk = split_for_speech("一二三。四五六。" * 10, 20)
    assert "".join(cjk) == "一二三。四五六。" * 10 and [len(segment) for segment in cjk] == [20] * 4  # no spaces


async def test_long_input_is_ordered_segments_whose_audio_is_one_response(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    text = LONG_TEXT[:4096]
    async with served_gateway(segment_chars=400) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        response = await client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm",
                                                                "stream_format": "sse", "seed": 3})
    assert response.status_code == 200, response.text
    segments = split_for_speech(text, 400)
    request_id = response.headers["x-request-id"]
    assert [r.id for r in standin.requests] == [segment_id(request_id, k) for k in range(len(segments))]
    assert [r.text for r in standin.requests] == segments and {r.seed for r in standin.requests} == {3}
    events = parse_sse(response.text)
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == expected_pcm(1) * len(segments)
    done = events[-1]
    assert (done["type"], done["chunk_count"], done["request_id"]) == ("speech.audio.done", len(segments), request_id)


async def test_a_failed_segment_fails_the_response_with_its_code(standin, served_gateway):
    standin.plan = Plan(num_chunks=1, fail_after=0, failure=(ErrorCode.CAPACITY, Stage.DECODE))
    standin.start_consumer()
    async with served_gateway(segment_chars=400) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        response = await client.post("/v1/audio/speech", json={"input": LONG_TEXT[:4096]})
        num_started = len(standin.requests)
        standin.plan = Plan(num_chunks=1)
        after = await client.post("/v1/audio/speech", json={"input": "Still serving.", "response_format": "pcm"})
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["stage"]) == (503, "capacity", "decode"), error
    assert error["request_id"] == response.headers["x-request-id"]
    assert num_started <= 2  # the first segment failed: only the look-ahead had started, nothing after it
    assert after.status_code == 200 and after.content == expected_pcm(1)
