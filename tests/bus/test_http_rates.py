"""`sample_rate` over real HTTP (the gateway under uvicorn, the stand-in decode and vocoder on a real nats-server):
each format at a rate other than its default, whole, streamed and as SSE, says the rate in `X-Sample-Rate` and
carries the same audio either way (a streamed wav or flac differs from the whole file only in its header's length);
raw PCM is libsoxr's resampling of the whole 24 kHz audio; aac is ADTS, the same bytes streamed or whole, decoded by
FFmpeg through PyAV; a rate a format lacks is refused with nothing queued."""

from __future__ import annotations

import io
import struct

import av
import httpx
import numpy as np
import pytest
import soundfile

from services.gateway.requests.resampler import resampled
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import standin_http_client
from tests.support.gateway_standin import expected_pcm
from tests.support.g711_tables import decode as g711_decode
from tests.support.http_client import parse_sse, sse_audio

pytestmark = pytest.mark.timeout(90)

CHUNKS = 5


@pytest.fixture
async def client(standin, served_gateway):
    async with standin_http_client(standin, served_gateway, CHUNKS) as http:
        yield http


async def speak(client: httpx.AsyncClient, **fields) -> httpx.Response:
    return await client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": "ryan", **fields})


async def streamed(client: httpx.AsyncClient, **fields) -> tuple[httpx.Response, bytes]:
    async with client.stream("POST", "/v1/audio/speech", json={"input": "Hello there.", "voice": "ryan",
                                                               "stream_format": "audio", **fields}) as response:
        return response, b"".join([piece async for piece in response.aiter_raw()])


def samples_of(fmt: str, data: bytes, rate: int) -> tuple[int, np.ndarray]:
    """(rate, samples) as an independent decoder reads them (the tests' G.711 tables; libsndfile for the rest, a
    streamed wav's or flac's unknown length written in first, as libsndfile wants it)."""
    if fmt == "pcm":
        return rate, np.frombuffer(data, dtype="<i2")
    if fmt in ("ulaw", "alaw"):
        return rate, g711_decode(data, fmt)
    if fmt == "aac":
        with av.open(io.BytesIO(data), format="adts") as container:
            frames = [frame.to_ndarray().ravel() for frame in container.decode(audio=0)]
            return container.streams.audio[0].rate, np.concatenate(frames)
    if fmt == "wav" and data[4:8] == b"\xff\xff\xff\xff":
        data = data[:4] + struct.pack("<I", len(data) - 8) + data[8:40] + struct.pack("<I", len(data) - 44) + data[44:]
    if fmt == "flac" and int.from_bytes(data[18:26], "big") & (1 << 36) - 1 == 0:
        count = len(expected_pcm(CHUNKS)) // 2 * rate // 24000
        data = data[:18] + ((int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)) | count).to_bytes(8, "big") \
            + data[26:]
    with soundfile.SoundFile(io.BytesIO(data)) as file:
        return file.samplerate, np.concatenate(list(file.blocks(blocksize=4096, dtype="int16")))


@pytest.mark.parametrize(("fmt", "rate"), [("pcm", 16000), ("wav", 44100), ("flac", 8000), ("mp3", 22050),
                                           ("opus", 48000), ("aac", 44100), ("ulaw", 16000), ("alaw", 24000)])
async def test_each_format_at_another_rate_is_the_same_audio_whole_streamed_and_as_events(client, fmt, rate):
    whole = await speak(client, response_format=fmt, sample_rate=rate)
    streaming, streamed_bytes = await streamed(client, response_format=fmt, sample_rate=rate)
    events = await speak(client, response_format=fmt, sample_rate=rate, stream_format="sse")
    for response in (whole, streaming, events):
        assert response.status_code == 200, response.text
        assert response.headers["x-sample-rate"] == str(rate)
    whole_rate, whole_samples = samples_of(fmt, whole.content, rate)
    streamed_rate, streamed_samples = samples_of(fmt, streamed_bytes, rate)
    events_rate, events_samples = samples_of(fmt, sse_audio(parse_sse(events.text)), rate)
    assert whole_rate == streamed_rate == events_rate == rate
    assert np.array_equal(whole_samples, streamed_samples) and np.array_equal(whole_samples, events_samples)
    if fmt in ("pcm", "wav", "flac"):  # lossless: libsoxr's resampling of the whole 24 kHz audio
        assert whole_samples.tobytes() == resampled(expected_pcm(CHUNKS), 24000, rate)


@pytest.mark.parametrize("rate", [None, 8000])
async def test_aac_is_adts_the_same_bytes_streamed_or_whole(client, rate):
    fields = {"response_format": "aac"} | ({} if rate is None else {"sample_rate": rate})
    whole = await speak(client, **fields)
    streaming, streamed_bytes = await streamed(client, **fields)
    for response in (whole, streaming):
        assert (response.status_code, response.headers["content-type"]) == (200, "audio/aac")
        assert response.headers["x-sample-rate"] == str(rate or 24000)
    assert streamed_bytes == whole.content and whole.content[:2] == b"\xff\xf1"  # ADTS frames, nothing else
    decoded_rate, samples = samples_of("aac", whole.content, rate or 24000)
    expected = len(expected_pcm(CHUNKS)) // 2 * (rate or 24000) // 24000
    assert decoded_rate == (rate or 24000) and expected <= len(samples) <= expected + 3 * 1024  # priming, padding


async def test_an_openai_style_body_names_the_rate_beside_the_format(client):
    response = await speak(client, response_format="pcm", sample_rate=8000, stream=True)
    assert (response.status_code, response.headers["x-sample-rate"]) == (200, "8000")
    assert response.content == resampled(expected_pcm(CHUNKS), 24000, 8000)
    assert len(response.content) == len(expected_pcm(CHUNKS)) // 3


@pytest.mark.parametrize(("fields", "code", "named"), [
    ({"response_format": "opus", "sample_rate": 44100}, "unsupported_value", "8000, 12000, 16000, 24000, 48000"),
    ({"response_format": "wav", "sample_rate": 11025}, "unsupported_value", "8000, 16000, 22050, 24000, 44100, 48000"),
    ({"response_format": "ulaw", "sample_rate": 12000, "stream": True}, "unsupported_value", "22050"),
    ({"response_format": "pcm", "sample_rate": 0}, "out_of_range", "sample_rate"),
    ({"response_format": "pcm", "sample_rate": "16000"}, "invalid_type", "sample_rate"),
    ({"response_format": "speex", "sample_rate": 16000}, "unsupported_format", "ulaw, alaw"),
])
async def test_a_rate_or_format_that_is_not_served_is_refused_with_nothing_queued(client, standin, fields, code,
                                                                                    named):
    response = await speak(client, **fields)
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, code)
    assert error["param"] == ("response_format" if code == "unsupported_format" else "sample_rate")
    assert named in error["message"]
    assert standin.requests == []
