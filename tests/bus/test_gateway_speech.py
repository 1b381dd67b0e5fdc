"""POST /v1/audio/speech against a real nats-server, driven by the stand-in decode/vocoder."""

from __future__ import annotations

import asyncio
import io
import wave

import pytest

from messages import decode, subjects
from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode, Stage
from messages.events import Accepted, Failed
from messages.frames import AudioChunk
from messages.streams import EVENTS_STREAM
from services.gateway.errors import RequestFailed
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.repair import RepairPolicy
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, gateway_factory...)
from tests.support.gateway_standin import Plan, expected_pcm

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


def read_wav(data: bytes) -> tuple[int, int, int, bytes]:
    with wave.open(io.BytesIO(data)) as reader:
        return reader.getframerate(), reader.getnchannels(), reader.getsampwidth(), reader.readframes(10**9)


async def test_speech_returns_wav_of_every_chunk_in_order(standin, gateway_factory):
    standin.plan = Plan(num_chunks=4)
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"model": "tiny", "input": "Hello there.",
                                                                "voice": "Ryan"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    request_id = response.headers["x-request-id"]
    rate, channels, width, pcm = read_wav(response.content)
    assert (rate, channels, width) == (SAMPLE_RATE, 1, 2)
    assert pcm == expected_pcm(4)
    [queued] = standin.requests
    assert queued.id == request_id
    assert queued.speaker == "ryan" and queued.text == "Hello there."


async def test_chunks_published_out_of_order_arrive_in_order(standin, gateway_factory):
    standin.plan = Plan(num_chunks=5, order=(3, 0, 4, 2, 1))
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Out of order.", "voice": "vivian"})
    assert response.status_code == 200, response.text
    assert read_wav(response.content)[3] == expected_pcm(5)  # in order, nothing twice, nothing missing


async def test_dropped_chunk_is_repaired_by_redecode(standin, gateway_factory):
    standin.plan = Plan(num_chunks=4, drop=frozenset({1}))
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Lost one.", "voice": "ryan"})
    assert response.status_code == 200, response.text
    assert read_wav(response.content)[3] == expected_pcm(4)
    request_id = response.headers["x-request-id"]
    assert [(r.request_id, r.from_seq) for r in standin.redecodes][:1] == [(request_id, 1)]


async def test_dropped_last_chunk_is_repaired_from_the_terminal_count(standin, gateway_factory):
    # Nothing later arrives to reveal the gap: only the terminal's chunk_count says chunk 2 is missing.
    standin.plan = Plan(num_chunks=3, drop=frozenset({2}))
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Lost the last.", "voice": "ryan"})
    assert response.status_code == 200, response.text
    assert read_wav(response.content)[3] == expected_pcm(3)
    assert [r.from_seq for r in standin.redecodes] == [2]


async def test_unrepairable_gap_fails_with_the_vocoders_reason(standin, gateway_factory):
    standin.plan = Plan(num_chunks=3, drop=frozenset({1}), answer_redecode=False)
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Gone for good.", "voice": "ryan"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal" and error["stage"] == "vocoder"
    assert "scripted refusal" in error["message"] and "chunk 1" in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]


async def test_failure_mid_stream_answers_the_error_with_its_status(standin, gateway_factory):
    standin.plan = Plan(num_chunks=4, fail_after=2, failure=(ErrorCode.PREEMPTED, Stage.DECODE))
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Cut short.", "voice": "ryan"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["code"], error["stage"]) == ("preempted", "decode")
    assert "scripted failure after 2 chunks" in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]


async def test_model_error_is_a_500(standin, gateway_factory):
    standin.plan = Plan(num_chunks=2, fail_after=0)
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Broken.", "voice": "ryan"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "model_error"


async def test_pcm_format_returns_raw_samples(standin, gateway_factory):
    standin.plan = Plan(num_chunks=2)
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Raw.", "voice": "eric",
                                                                "response_format": "pcm"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/pcm"
    assert response.content == expected_pcm(2)


async def test_request_carries_the_clients_fields_and_is_announced(standin, gateway_factory, gateway_bus):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    body = {"input": "Fields.", "voice": "Vivian", "language": "English", "seed": 1234, "temperature": 0.0,
            "top_k": 5, "top_p": 0.5, "repetition_penalty": 1.1, "max_new_tokens": 40, "initial_chunk_frames": 1,
            "text_mode": "streaming", "instructions": "calm"}
    async with gateway_factory(request_deadline_s=7.0) as client:
        response = await client.post("/v1/audio/speech", json=body)
        second = await client.post("/v1/audio/speech", json={"input": "No seed.", "voice": "ryan"})
    assert response.status_code == 200 and second.status_code == 200
    first, unseeded = standin.requests
    assert (first.speaker, first.language, first.seed, first.text_mode, first.instruct) == (
        "vivian", "english", 1234, "streaming", "calm")
    assert (first.sampling.temperature, first.sampling.top_k, first.sampling.top_p,
            first.sampling.repetition_penalty) == (0.0, 5, 0.5, 1.1)
    assert (first.max_new_tokens, first.initial_chunk_frames) == (40, 1)
    assert first.deadline == pytest.approx(first.created_at + 7.0)
    assert 0 <= unseeded.seed < 2**63 and unseeded.id != first.id
    accepted = await gateway_bus.js.get_last_msg(EVENTS_STREAM, subjects.event(first.id, Accepted.KIND))
    event = decode(accepted.data, Accepted)
    assert (event.seed, event.model, event.text_chars) == (1234, "tiny", len("Fields."))


async def test_failed_request_with_a_lost_chunk_reports_its_own_failure(standin, gateway_factory):
    # The terminal's error is the cause a client can act on; the unrepairable gap is only a consequence.
    standin.plan = Plan(num_chunks=4, fail_after=3, drop=frozenset({1}), answer_redecode=False,
                        failure=(ErrorCode.CAPACITY, Stage.DECODE))
    standin.start_consumer()
    async with gateway_factory() as client:
        response = await client.post("/v1/audio/speech", json={"input": "Double trouble.", "voice": "ryan"})
    assert response.status_code == 503
    assert (response.json()["error"]["code"], response.json()["error"]["stage"]) == ("capacity", "decode")
    assert [r.from_seq for r in standin.redecodes] == [1]


async def test_a_refused_repair_that_overtakes_the_failed_terminal_still_reports_the_terminals_error():
    # The refusal comes straight back, the terminal through EVENTS: here the stream has handled the refusal before the
    # terminal arrives at all (the order a loaded gateway sees), and the client still gets the terminal's cause.
    stream = AudioStream(None, None, "req-overtaken", 0, RepairPolicy(arrival_timeout_s=30.0))
    refused = asyncio.Event()

    async def refusing_repair(from_seq: int) -> None:
        refused.set()
        raise RequestFailed(ErrorCode.INTERNAL, f"the vocoder refused to re-decode chunk {from_seq}",
                            stage=Stage.VOCODER, chunk_count=from_seq)

    stream._repair.ensure = refusing_repair
    for seq in (0, 2):  # chunk 1 lost
        stream._pending[seq] = AudioChunk(request_id="req-overtaken", seq=seq, first_sample=seq * 1920,
                                          sample_rate=SAMPLE_RATE, pcm=b"\0\0" * 1920)

    async def consume() -> list[int]:
        return [chunk.seq async for chunk in stream.chunks()]

    reading = asyncio.create_task(consume())
    await asyncio.wait_for(refused.wait(), 10)
    assert not reading.done(), "a refusal with no terminal seen yet is not the end"
    stream.note_terminal(Failed(request_id="req-overtaken", at=0.0, stage=Stage.DECODE, code=ErrorCode.CAPACITY,
                                reason="the pool was full", frames=6, chunk_count=3))
    with pytest.raises(RequestFailed) as failed:
        await asyncio.wait_for(reading, 10)
    assert (failed.value.code, failed.value.stage) == (ErrorCode.CAPACITY, Stage.DECODE)
