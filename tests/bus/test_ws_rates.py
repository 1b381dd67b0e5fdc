"""The WebSocket's `sample_rate` on a real uvicorn and a real nats-server, with the scripted decode/vocoder stand-in:
`session.update` sets the rate of binary frames and `audio.delta` events (a bad rate is refused and changes nothing),
the audio is one frame a chunk plus the resampling filter's tail, the bytes of the HTTP answer; and a resume (on the
same gateway, or on another after its own died) gets, chunk for chunk, the frames the first stream would have sent:
the gateway replays the request from its first chunk through a fresh resampler."""

from __future__ import annotations

import pytest

from services.gateway.http.encoders import stream_encoder
from services.gateway.requests.resampler import resampled
from services.gateway.requests.response_formats import FORMATS
from tests.bus.test_ws_standin import CHUNK_BYTES, finish, url
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import Plan, expected_pcm
from tests.support.ws_client import ws_connect

pytestmark = pytest.mark.timeout(60)

CHUNKS = 6


def frames_of_an_unbroken_stream(response_format: str, rate: int) -> list[bytes]:
    """What a socket must send for the stand-in's request: each chunk through one encoder, then the filter's tail."""
    encoder = stream_encoder(FORMATS[response_format], 24000, rate)
    pcm = expected_pcm(CHUNKS)
    frames = [encoder.feed(pcm[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]) for i in range(CHUNKS)]
    return frames + [encoder.finish()]


@pytest.mark.parametrize(("ws_format", "rate"), [("pcm_s16le", 16000), ("pcm_s16le_base64", 44100),
                                                 ("pcm_alaw", 22050)])
async def test_session_update_sets_the_rate_of_the_audio(standin, served_gateway, ws_format, rate):
    standin.plan = Plan(num_chunks=CHUNKS)
    standin.start_consumer()
    async with served_gateway() as port, ws_connect(url(port)) as client:
        await client.send("session.update", voice="ryan", format=ws_format, sample_rate=12000)  # not served
        refused = (await client.until("error", "session.updated")).event
        await client.send("session.update", voice="ryan", format=ws_format, sample_rate=rate)
        updated = (await client.until("session.updated", "error")).event
        await client.send("input.text", text="Hello there.")
        await client.send("input.done")
        got = await client.until("audio.done", "error")
        await client.until("session.done", "error")
    assert (refused["type"], refused["code"], refused["param"]) == ("error", "unsupported_value", "sample_rate")
    assert "44100" in refused["message"]
    assert updated["session"]["sample_rate"] == rate
    (start,) = [event for event in got.events if event["type"] == "audio.start"]
    assert (start["format"], start["sample_rate"]) == (ws_format, rate)
    assert got.event["type"] == "audio.done" and got.event["chunk_count"] == CHUNKS
    response_format = {"pcm_alaw": "alaw"}.get(ws_format, "pcm")
    assert got.frames == frames_of_an_unbroken_stream(response_format, rate)  # one a chunk, then the tail
    if response_format == "pcm":
        assert got.pcm == resampled(expected_pcm(CHUNKS), 24000, rate)  # the bytes of HTTP's pcm at that rate
    assert len(standin.requests) == 1  # the refused update queued nothing


async def test_a_resume_gets_the_frames_the_first_stream_would_have_sent(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=CHUNKS, hang_after=3)
    standin.start_consumer()
    unbroken = frames_of_an_unbroken_stream("pcm", 16000)
    async with served_gateway(resume_window_s=30.0) as port:
        async with ws_connect(url(port)) as client:
            await client.send("session.update", voice="ryan", sample_rate=16000)
            await client.send("input.text", text="Resume me.\n")
            start = (await client.until("audio.start")).event
            seen = await client.until(frames=3)
        request_id = start["request_id"]
        await finish(gateway_bus, request_id, chunk_count=CHUNKS)  # it ends while the client is away
        async with ws_connect(url(port)) as client:
            await client.send("session.update", sample_rate=16000)  # the rate of the first stream
            await client.send("resume", request_id=request_id, last_seq=1, resume_token=start["resume_token"])
            resumed = await client.until("audio.done", "error")
    again = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (again["first_seq"], again["resumed"], again["sample_rate"]) == (2, True, 16000)
    assert seen.frames == unbroken[:3]
    assert resumed.frames == unbroken[2:], "chunks 2.. and the tail, exactly as an unbroken stream sends them"
    assert [r.from_seq for r in standin.redecodes] == [0]  # replayed from the start through the resampler


async def test_a_resume_on_another_gateway_after_its_own_died_gets_the_same_frames(standin, served_gateway,
                                                                                   gateway_bus):
    standin.plan = Plan(num_chunks=CHUNKS, hang_after=3)
    standin.start_consumer()
    unbroken = frames_of_an_unbroken_stream("ulaw", 8000)
    async with served_gateway(resume_window_s=30.0) as port:  # the gateway that streamed it, gone after this block
        async with ws_connect(url(port)) as client:
            await client.send("session.update", voice="ryan", format="pcm_mulaw")
            await client.send("input.text", text="My gateway dies.\n")
            start = (await client.until("audio.start")).event
            seen = await client.until(frames=3)
    await finish(gateway_bus, start["request_id"], chunk_count=CHUNKS)
    async with served_gateway(resume_window_s=30.0, replica="gateway-heir") as port:
        async with ws_connect(url(port)) as client:
            await client.send("session.update", format="pcm_mulaw")
            await client.send("resume", request_id=start["request_id"], last_seq=2,
                              resume_token=start["resume_token"])
            resumed = await client.until("audio.done", "error")
    assert resumed.event["type"] == "audio.done", resumed.event
    assert seen.frames + resumed.frames == unbroken
