"""`POST /v1/audio/speech` through the official `openai` client, against the real gateway under uvicorn, a real
nats-server and the stand-in decode/vocoder: every response format, plain and streamed (`audio` and `sse`), the
voxmesh extras, and what a client sees when a request fails before or after its first audio."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import httpx
import numpy as np
import openai
import pytest

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.errors import ErrorCode, Stage
from services.gateway.http.encoders import UNKNOWN_SIZE
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import Plan, expected_pcm
from tests.support.http_client import decode_audio, next_cancel, openai_client, parse_sse, read_wav, sse_audio

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

SAMPLES_PER_CHUNK = 2 * SAMPLES_PER_FRAME  # the stand-in's chunks: 2 frames each


def expected_samples(num_chunks: int) -> np.ndarray:
    return np.frombuffer(expected_pcm(num_chunks), dtype="<i2")


async def speak(port: int, **fields):
    """One plain (whole-file) request through the openai client; returns its raw HTTP response."""
    async with openai_client(f"http://127.0.0.1:{port}") as client:
        answer = await client.audio.speech.create(model="tiny", voice="ryan", input="Hello there.", **fields)
    return answer.response


@contextlib.asynccontextmanager
async def streamed(port: int, **fields):
    """One request through the openai client's `with_streaming_response`; yields the streamed response."""
    call = {"model": "tiny", "voice": "ryan", "input": "Hello there.", **fields}
    async with openai_client(f"http://127.0.0.1:{port}") as client:
        async with client.audio.speech.with_streaming_response.create(**call) as stream:
            yield stream


@pytest.mark.parametrize("response_format", ["wav", "pcm", "flac"])
async def test_openai_client_gets_exact_audio_in_each_lossless_format(standin, served_gateway, response_format):
    standin.plan = Plan(num_chunks=3)
    standin.start_consumer()
    async with served_gateway() as port:
        response = await speak(port, response_format=response_format)
    assert response.headers["x-request-id"] == standin.requests[0].id
    assert response.headers["content-length"] == str(len(response.content))
    if response_format == "wav":
        assert response.headers["content-type"] == "audio/wav"
        assert read_wav(response.content) == (SAMPLE_RATE, 1, 2, expected_pcm(3))
    elif response_format == "pcm":
        assert response.headers["content-type"] == "audio/pcm"
        assert response.content == expected_pcm(3)
    else:
        assert response.headers["content-type"] == "audio/flac" and response.content[:4] == b"fLaC"
        rate, samples = decode_audio(response.content)
        assert rate == SAMPLE_RATE
        np.testing.assert_array_equal(samples, expected_samples(3))


@pytest.mark.parametrize(("response_format", "media_type", "magic"), [("mp3", "audio/mpeg", b"\xff"),
                                                                       ("opus", "audio/ogg", b"OggS")])
async def test_lossy_formats_decode_to_the_requests_length(standin, served_gateway, response_format, media_type,
                                                           magic):
    standin.plan = Plan(num_chunks=4)
    standin.start_consumer()
    async with served_gateway() as port:
        response = await speak(port, response_format=response_format)
    assert response.headers["content-type"] == media_type and response.content.startswith(magic)
    rate, samples = decode_audio(response.content)
    assert rate == SAMPLE_RATE
    # Codecs pad the start and end (mp3: encoder delay; opus: pre-skip rounding): at most ~60 ms more.
    assert 4 * SAMPLES_PER_CHUNK <= len(samples) <= 4 * SAMPLES_PER_CHUNK + 1500


async def test_streamed_wav_arrives_while_the_request_still_runs(standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=5, hang_after=1)  # one chunk, then nothing: only streaming can deliver it
    standin.start_consumer()
    async with served_gateway(resume_window_s=0.2) as port:
        async with streamed(port, input="Stream me.", response_format="wav", stream_format="audio") as stream:
            received = b""
            async for piece in stream.iter_bytes():
                received += piece
                if len(received) >= 44 + SAMPLES_PER_CHUNK * 2:
                    break
            request_id = stream.headers["x-request-id"]
        # The client left mid-request: after the resume window the request is cancelled in the mesh.
        cancel = await asyncio.wait_for(next_cancel(gateway_bus.kv, request_id), 10)
    assert stream.headers["content-type"] == "audio/wav" and "content-length" not in stream.headers
    assert received[:4] == b"RIFF" and struct.unpack("<I", received[4:8])[0] == UNKNOWN_SIZE
    assert struct.unpack("<I", received[40:44])[0] == UNKNOWN_SIZE  # data size unknown: a streaming header
    assert received[44:] == expected_pcm(1)
    assert cancel.code == "cancelled"


async def test_streamed_wav_holds_every_chunk_in_order(standin, served_gateway):
    standin.plan = Plan(num_chunks=4, order=(2, 0, 3, 1))
    standin.start_consumer()
    async with served_gateway() as port:
        async with streamed(port, input="In order.", response_format="wav", stream_format="audio") as stream:
            body = await stream.read()
    assert read_wav(body)[:3] == (SAMPLE_RATE, 1, 2)
    assert body[44:] == expected_pcm(4)


async def test_streamed_flac_is_the_whole_file_but_for_its_unknown_length(standin, served_gateway):
    standin.plan = Plan(num_chunks=3)
    standin.start_consumer()
    async with served_gateway() as port:
        whole = (await speak(port, response_format="flac")).content
        async with streamed(port, response_format="flac", stream_format="audio") as stream:
            streamed_file = await stream.read()
    # STREAMINFO (bytes 8..41): frame sizes, total samples and MD5 are only known at the end; a stream leaves
    # them 0 ("unknown", as FLAC allows). Every audio frame is byte for byte the whole file's.
    assert streamed_file[:12] == whole[:12] and streamed_file[42:] == whole[42:]
    total_samples = lambda data: int.from_bytes(data[18:26], "big") & ((1 << 36) - 1)  # noqa: E731
    assert (total_samples(streamed_file), total_samples(whole)) == (0, 3 * SAMPLES_PER_CHUNK)


@pytest.mark.parametrize("response_format", ["mp3", "opus"])
async def test_streamed_lossy_formats_play_whole(standin, served_gateway, response_format):
    standin.plan = Plan(num_chunks=4)
    standin.start_consumer()
    async with served_gateway() as port:
        whole = (await speak(port, response_format=response_format)).content
        async with streamed(port, response_format=response_format, stream_format="audio") as stream:
            streamed_file = await stream.read()
    # mp3: plain CBR frames, no header to rewrite; opus: Ogg pages with no random serial: a stream is the whole file.
    assert streamed_file == whole
    rate, samples = decode_audio(streamed_file)
    assert rate == SAMPLE_RATE and len(samples) == len(decode_audio(whole)[1])


async def test_sse_sends_deltas_then_done_with_usage(standin, served_gateway):
    standin.plan = Plan(num_chunks=3)
    standin.start_consumer()
    async with served_gateway() as port:
        async with streamed(port, input="Events.", response_format="pcm", stream_format="sse") as stream:
            events = parse_sse(await stream.text())
            headers = stream.headers
    assert headers["content-type"].startswith("text/event-stream")
    assert [event["type"] for event in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert sse_audio(events) == expected_pcm(3)
    done = events[-1]
    assert set(done["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
    assert (done["request_id"], done["chunk_count"], done["frames"]) == (headers["x-request-id"], 3, 6)
    assert done["duration_s"] == pytest.approx(3 * SAMPLES_PER_CHUNK / SAMPLE_RATE)


async def test_sse_wav_deltas_make_a_streaming_wav(standin, served_gateway):
    standin.plan = Plan(num_chunks=2)
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        response = await client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "ryan",
                                                                "stream_format": "sse"})
    audio = sse_audio(parse_sse(response.text))
    assert audio[:4] == b"RIFF" and audio[44:] == expected_pcm(2)


async def test_sse_failure_after_audio_ends_with_an_error_event(standin, served_gateway):
    standin.plan = Plan(num_chunks=4, fail_after=2, failure=(ErrorCode.PREEMPTED, Stage.DECODE))
    standin.start_consumer()
    async with served_gateway() as port:
        async with streamed(port, input="Cut.", response_format="pcm", stream_format="sse") as stream:
            events = parse_sse(await stream.text())
            request_id = stream.headers["x-request-id"]
    assert stream.status_code == 200  # the status went out with the first audio
    assert [event["type"] for event in events] == ["speech.audio.delta"] * 2 + ["error"]
    assert sse_audio(events) == expected_pcm(2)  # the audio so far, then the error
    error = events[-1]["error"]
    assert (error["code"], error["stage"], error["type"]) == ("preempted", "decode", "server_error")
    assert "scripted failure after 2 chunks" in error["message"] and error["request_id"] == request_id


async def test_audio_stream_failure_after_audio_cuts_the_body(standin, served_gateway):
    standin.plan = Plan(num_chunks=4, fail_after=2, failure=(ErrorCode.PREEMPTED, Stage.DECODE))
    standin.start_consumer()
    received = b""
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        body = {"input": "Cut.", "voice": "ryan", "response_format": "pcm", "stream_format": "audio"}
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            with pytest.raises(httpx.RemoteProtocolError):  # no final chunk: the client knows it is incomplete
                async for piece in response.aiter_bytes():
                    received += piece
    assert response.status_code == 200 and received == expected_pcm(2)


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_failure_before_any_audio_is_an_http_error_in_streamed_modes(standin, served_gateway, stream_format):
    standin.plan = Plan(num_chunks=2, fail_after=0)
    standin.start_consumer()
    async with served_gateway() as port:
        with pytest.raises(openai.InternalServerError) as failed:
            async with streamed(port, stream_format=stream_format):
                pass
    assert failed.value.status_code == 500 and failed.value.code == "model_error"
    assert failed.value.request_id == standin.requests[0].id


async def test_voxmesh_extras_reach_the_request(standin, served_gateway):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    extras = {"language": "English", "seed": 77, "temperature": 0.0, "top_k": 3, "top_p": 0.9,
              "repetition_penalty": 1.05, "max_new_tokens": 30, "min_new_tokens": 5, "ignore_eos": True,
              "initial_chunk_frames": 1, "text_mode": "streaming"}
    async with served_gateway() as port:
        async with openai_client(f"http://127.0.0.1:{port}") as client:
            await client.audio.speech.create(model="tiny", voice={"id": "Vivian"}, input="Extras.",
                                             instructions="calm", speed=1.0, extra_body=extras)
    [request] = standin.requests
    assert (request.speaker, request.language, request.seed, request.instruct) == ("vivian", "english", 77, "calm")
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.top_p,
            request.sampling.repetition_penalty) == (0.0, 3, 0.9, 1.05)
    assert (request.max_new_tokens, request.min_new_tokens, request.ignore_eos, request.initial_chunk_frames,
            request.text_mode) == (30, 5, True, 1, "streaming")
