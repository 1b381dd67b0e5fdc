"""The speech body's fields from vLLM-Omni and SGLang-Omni over real HTTP (the gateway under uvicorn, the stand-in
decode and vocoder on a real nats-server): each accepted field does what the README's table says (seen in the
answer and in the request that reached the queue), and each bad value gets its specific code with nothing queued."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from services.gateway.requests.body import REFUSED_FIELDS
from services.random_checkpoint.model_presets import generation_config, preset_config
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import standin_http_client
from tests.support.gateway_standin import MODEL, Plan, expected_pcm
from tests.support.http_client import parse_sse
from tests.support.reference_audio_files import reference_uri

pytestmark = pytest.mark.timeout(60)

# The body vLLM-Omni's and SGLang-Omni's clients (and the open-loop TTS benchmarks built for them) send.
PEER_BODY = {"input": "Hello there.", "voice": "Ryan", "language": "English", "stream": True,
             "non_streaming_mode": False, "response_format": "pcm", "stream_format": "audio"}
CHUNKS = 3


async def speak(client: httpx.AsyncClient, **fields) -> httpx.Response:
    return await client.post("/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm", **fields})


@pytest.fixture
async def client(standin, served_gateway):
    async with standin_http_client(standin, served_gateway, CHUNKS) as http:
        yield http


async def test_the_peer_servers_body_streams_raw_pcm_as_it_is_made(client, standin):
    async with client.stream("POST", "/v1/audio/speech", json=PEER_BODY) as response:
        pieces = [piece async for piece in response.aiter_raw()]
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/pcm" and "content-length" not in response.headers
    assert (response.headers["x-sample-rate"], response.headers["x-channels"], response.headers["x-bit-depth"]) == \
        ("24000", "1", "16")
    assert b"".join(pieces) == expected_pcm(CHUNKS)
    (queued,) = standin.requests
    assert (queued.speaker, queued.language, queued.text_mode) == ("ryan", "english", "streaming")


async def test_stream_true_is_the_byte_stream_and_false_the_whole_file(client):
    streamed = await speak(client, stream=True)
    audio = await speak(client, stream_format="audio")
    whole = await speak(client, stream=False)
    events = await speak(client, stream=True, stream_format="sse")
    for response in (streamed, audio, whole, events):
        assert response.status_code == 200, response.text
    assert streamed.content == audio.content == whole.content == expected_pcm(CHUNKS)
    assert "content-length" not in streamed.headers and "content-length" not in audio.headers
    assert whole.headers["content-length"] == str(len(expected_pcm(CHUNKS)))
    assert events.headers["content-type"].startswith("text/event-stream")
    assert parse_sse(events.text)[-1]["type"] == "speech.audio.done"


async def test_non_streaming_mode_is_the_text_mode(client, standin):
    bodies = [{}, {"non_streaming_mode": True}, {"non_streaming_mode": False}, {"text_mode": "streaming"},
              {"text_mode": "streaming", "non_streaming_mode": False},
              {"text_mode": "non-streaming", "non_streaming_mode": True}]
    for body in bodies:
        response = await speak(client, **body)
        assert response.status_code == 200, (body, response.text)
    assert [request.text_mode for request in standin.requests] == [
        "non-streaming", "non-streaming", "streaming", "streaming", "streaming", "non-streaming"]


async def test_other_names_and_the_values_that_change_nothing_are_accepted(client, standin):
    accepted = [
        {"speaker": "Vivian"},  # voice's other name
        {"speaker": "eric", "voice": "Eric"},  # both, naming the same voice
        {"voice": "default"},  # SGLang-Omni's default voice: the model's first speaker
        {"initial_codec_chunk_frames": 3},  # initial_chunk_frames's other name
        {"initial_codec_chunk_frames": 4, "initial_chunk_frames": 4},
        {"task_type": "CustomVoice"},  # what the tiny custom_voice checkpoint does
        {"sample_rate": 24000, "word_timestamps": False, "stream_codec_output": False,
         "suppress_bootstrap_silence": False},
        {name: None for name in REFUSED_FIELDS},  # a client that sends every field it knows, at its default
        {"speed": None, "language": None, "x_vector_only_mode": None, "voice": None, "seed": None, "model": None,
         "instructions": None, "max_new_tokens": None, "task_type": None, "stream": None, "stream_format": None,
         "non_streaming_mode": None, "initial_codec_chunk_frames": None, "sample_rate": None},
    ]
    for body in accepted:
        response = await speak(client, **body)
        assert response.status_code == 200, (body, response.text)
        assert response.content == expected_pcm(CHUNKS)
    speakers = [request.speaker for request in standin.requests]
    first_chunks = [request.initial_chunk_frames for request in standin.requests]
    assert speakers == ["vivian", "eric", "ryan", "ryan", "ryan", "ryan", "ryan", "ryan", "ryan"]
    assert first_chunks == [None, None, None, 3, 4, None, None, None, None]
    assert (standin.requests[-1].language, standin.requests[-1].text_mode) == ("auto", "non-streaming")


REFUSED = [
    # (fields, status, code, param)
    ({"stream": False, "stream_format": "audio"}, 400, "conflicting_fields", "stream_format"),
    ({"stream": False, "stream_format": "sse"}, 400, "conflicting_fields", "stream_format"),
    ({"stream": "yes"}, 400, "invalid_type", "stream"),
    ({"non_streaming_mode": True, "text_mode": "streaming"}, 400, "conflicting_fields", "non_streaming_mode"),
    ({"non_streaming_mode": False, "text_mode": "non-streaming"}, 400, "conflicting_fields", "non_streaming_mode"),
    ({"non_streaming_mode": "false"}, 400, "invalid_type", "non_streaming_mode"),
    ({"task_type": "Base"}, 400, "task_type_mismatch", "task_type"),
    ({"task_type": "VoiceDesign"}, 400, "task_type_mismatch", "task_type"),
    ({"task_type": "Clone"}, 400, "invalid_value", "task_type"),
    ({"speaker": "vivian", "voice": "ryan"}, 400, "conflicting_fields", "speaker"),
    ({"speaker": "nobody"}, 400, "unknown_voice", "voice"),
    ({"initial_codec_chunk_frames": 0}, 400, "out_of_range", "initial_codec_chunk_frames"),
    ({"initial_codec_chunk_frames": 3, "initial_chunk_frames": 4}, 400, "conflicting_fields",
     "initial_codec_chunk_frames"),
    ({"sample_rate": 11025}, 400, "unsupported_value", "sample_rate"),  # served rates: tests/bus/test_http_rates.py
    ({"speed": 1.5}, 400, "unsupported_value", "speed"),
    ({"language": ""}, 400, "unknown_language", "language"),
    ({"sample_rate": 0}, 400, "out_of_range", "sample_rate"),
    ({"word_timestamps": True}, 400, "unsupported_value", "word_timestamps"),
    ({"stream_codec_output": True}, 400, "unsupported_value", "stream_codec_output"),
    ({"suppress_bootstrap_silence": True}, 400, "unsupported_value", "suppress_bootstrap_silence"),
    *[({name: value}, 400, "unsupported_field", name) for name, value in (
        ("speaker_embedding", [0.5] * 8), ("ref_audio_2", "data:audio/wav;base64,AAAA"), ("ambient_sound", "rain"),
        ("duration_seconds", 2.0), ("extra_params", {"cfg": 1}), ("token_count", 40), ("duration_tokens", 40),
        ("references", [{"audio_path": "a.wav", "text": "hi"}]), ("stage_params", {"talker": {"top_k": 5}}))],
    ({"stream_formats": "audio"}, 400, "unknown_field", "stream_formats"),  # still no guessing at typos
]


async def test_each_bad_value_gets_its_code_and_nothing_is_queued(client, standin):
    assert {fields_param for _, _, code, fields_param in REFUSED if code == "unsupported_field"} == set(REFUSED_FIELDS)
    healthy = asyncio.ensure_future(speak(client, input="Undisturbed, please."))
    refused = [await speak(client, **fields) for fields, *_ in REFUSED]
    served = await healthy
    for response, (fields, status, code, param) in zip(refused, REFUSED):
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["param"]) == (status, code, param), (fields, error)
        assert error["request_id"] == response.headers["x-request-id"]
    assert served.status_code == 200 and served.content == expected_pcm(CHUNKS)
    assert [request.text for request in standin.requests] == ["Undisturbed, please."]  # nothing else was queued


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset's config files as a base (voice-cloning) checkpoint."""
    directory = tmp_path_factory.mktemp("peer-fields-base-model")
    (directory / "config.json").write_text(json.dumps(preset_config(MODEL, "base")))
    (directory / "generation_config.json").write_text(json.dumps(generation_config(MODEL)))
    return directory


async def test_a_base_checkpoint_takes_task_type_base_and_the_peers_cloning_fields(standin, served_gateway,
                                                                                    base_model_dir):
    standin.plan = Plan(num_chunks=CHUNKS)
    standin.start_consumer()
    clone = {"input": "Hello.", "response_format": "pcm", "ref_audio": reference_uri(), "ref_text": "How I sound."}
    async with served_gateway(model_dir=str(base_model_dir)) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        cloned = await client.post("/v1/audio/speech", json={**clone, "task_type": "Base", "stream": True,
                                                             "x_vector_only_mode": None})
        refused = [await client.post("/v1/audio/speech", json={**clone, **change}) for change in (
            {"task_type": "CustomVoice"}, {"ref_audio": "https://example.com/me.wav"},
            {"ref_audio": [reference_uri()]})]
    assert cloned.status_code == 200 and cloned.content == expected_pcm(CHUNKS), cloned.text
    assert [(r.json()["error"]["code"], r.json()["error"]["param"]) for r in refused] == [
        ("task_type_mismatch", "task_type"), ("invalid_ref_audio", "ref_audio"), ("invalid_type", "ref_audio")]
    assert "base" in refused[0].json()["error"]["message"]
    assert len(standin.requests) == 1 and standin.requests[0].clone is not None
