"""Voice cloning in the gateway (real gateway, real nats-server, stand-in decode/vocoder): reference audio goes to
the REF_AUDIO object store and the request carries its key, never the audio; bad references are refused with
specific codes before anything is queued; the WebSocket takes a reference in `session.update`; saved voices are
listed, named by requests and deleted. Decode's side and the real computation are tested in
test_decode_voice_prompts.py and test_mesh_voice_clone.py."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import websockets

from messages import decode, encode, subjects
from messages.voice_clone import (REF_AUDIO_STORE, VOICES_STORE, ReferenceAudio, SavedVoice, VoiceCreate,
                                  VoiceCreated, saved_voice_key)
from services.bus.object_store import list_objects, open_object_store, read_object, write_object
from services.random_checkpoint.model_presets import generation_config, preset_config
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_fixtures import WS_PATH, receive_until_event
from tests.support.gateway_standin import MODEL, Plan, expected_pcm
from tests.support.reference_audio_files import audio_file, data_uri, reference_uri, tone

pytestmark = pytest.mark.timeout(90)

REF_TEXT = "This is how I sound."


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset's config files as a base (voice-cloning) checkpoint (the gateway reads no weights)."""
    directory = tmp_path_factory.mktemp("gateway-base-model")
    (directory / "config.json").write_text(json.dumps(preset_config(MODEL, "base")))
    (directory / "generation_config.json").write_text(json.dumps(generation_config(MODEL)))
    return directory


async def test_reference_audio_travels_as_a_key_and_the_audio_streams(standin, gateway_factory, gateway_bus,
                                                                       base_model_dir):
    standin.plan = Plan(num_chunks=2)
    standin.start_consumer()
    reference = reference_uri(seconds=2.0, sample_rate=16000, channels=2)
    async with gateway_factory(model_dir=str(base_model_dir)) as client:
        body = {"input": "Hello in my own voice.", "ref_audio": reference, "ref_text": REF_TEXT,
                "response_format": "pcm"}
        first = await client.post("/v1/audio/speech", json=body)
        again = await client.post("/v1/audio/speech", json=body | {"x_vector_only_mode": True, "ref_text": None})
    assert first.status_code == again.status_code == 200, first.text
    assert first.content == expected_pcm(2)
    clones = [request.clone for request in standin.requests]
    assert clones[0].audio_key == clones[1].audio_key, "the same recording is stored once, under one key"
    assert (clones[0].ref_text, clones[0].x_vector_only) == (REF_TEXT, False)
    assert (clones[1].ref_text, clones[1].x_vector_only) == (None, True)
    assert all(request.speaker is None for request in standin.requests)
    assert len(encode(standin.requests[0])) < 2048, "the audio never rides in the request message"
    store = await open_object_store(gateway_bus.js, REF_AUDIO_STORE)
    assert [o.name for o in await list_objects(store)] == [clones[0].audio_key]
    stored = decode((await read_object(store, clones[0].audio_key))[1], ReferenceAudio)
    samples = np.frombuffer(stored.samples, dtype="<f4")
    assert stored.sample_rate == 16000 and samples.shape == (32000,)
    expected = tone(2.0, 16000, channels=2).mean(axis=1)  # the channels mixed down
    np.testing.assert_allclose(samples, expected, atol=2e-4)


def _silence_file(seconds: float, rate: int = 8000) -> bytes:
    return audio_file(seconds, rate)


@pytest.mark.parametrize("change,code,param", [
    ({"ref_text": None}, "ref_text_required", "ref_text"),
    ({"ref_text": "   "}, "ref_text_required", "ref_text"),
    ({"ref_audio": "data:audio/wav;base64,!!not base64!!"}, "invalid_ref_audio", "ref_audio"),
    ({"ref_audio": "data:audio/wav,plain"}, "invalid_ref_audio", "ref_audio"),
    ({"ref_audio": data_uri(b"this is not audio at all" * 40)}, "invalid_ref_audio", "ref_audio"),
    ({"ref_audio": data_uri(_silence_file(0.5))}, "ref_audio_too_short", "ref_audio"),
    ({"ref_audio": data_uri(_silence_file(31.0))}, "ref_audio_too_long", "ref_audio"),
    ({"ref_audio": data_uri(b"\0" * (11 * 2**20))}, "invalid_ref_audio", "ref_audio"),  # over the size cap
    ({"ref_audio": None, "ref_text": None}, "voice_required", "voice"),
    ({"voice": "someone"}, "invalid_request", "voice"),  # reference audio and a saved voice at once
    ({"ref_audio": None, "voice": "nobody-saved-me"}, "unknown_voice", "voice"),
], ids=["no-ref-text", "blank-ref-text", "not-base64", "not-a-base64-uri", "not-audio", "too-short", "too-long",
        "too-large", "no-voice", "audio-and-voice", "unknown-saved-voice"])
async def test_bad_references_are_refused_before_the_queue(standin, gateway_factory, base_model_dir, change, code,
                                                           param):
    standin.start_consumer()
    body = {"input": "Hello.", "ref_audio": reference_uri(), "ref_text": REF_TEXT} | change
    async with gateway_factory(model_dir=str(base_model_dir)) as client:
        answer = await client.post("/v1/audio/speech", json={k: v for k, v in body.items() if v is not None})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert standin.requests == []


async def test_models_that_cannot_clone_refuse_the_cloning_fields(standin, gateway_factory):
    async with gateway_factory() as client:  # the tiny custom_voice model
        speech = await client.post("/v1/audio/speech", json={"input": "Hello.", "ref_audio": reference_uri(),
                                                             "ref_text": REF_TEXT})
        flag = await client.post("/v1/audio/speech", json={"input": "Hello.", "x_vector_only_mode": True})
        saved = await client.post("/v1/audio/voices", json={"name": "me", "audio": reference_uri(),
                                                            "ref_text": REF_TEXT})
    for answer, param in ((speech, "ref_audio"), (flag, "x_vector_only_mode"), (saved, "audio")):
        assert answer.status_code == 400
        assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("voice_cloning_unsupported",
                                                                                       param)


async def test_websocket_takes_a_reference_larger_than_its_message_limit(standin, served_gateway, base_model_dir):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    reference = reference_uri(seconds=3.0, sample_rate=24000)
    assert len(reference) > 64 * 1024
    async with served_gateway(model_dir=str(base_model_dir)) as port:
        async with websockets.connect(f"ws://127.0.0.1:{port}{WS_PATH}", max_size=None) as socket:
            await socket.send(json.dumps({"type": "session.update", "ref_audio": "data:audio/wav;base64,AAAA",
                                          "ref_text": REF_TEXT}))
            refused = json.loads(await socket.recv())
            await socket.send(json.dumps({"type": "session.update", "ref_audio": reference, "ref_text": REF_TEXT}))
            updated = json.loads(await socket.recv())
            await socket.send(json.dumps({"type": "input.text", "text": "Hello from the socket."}))
            await socket.send(json.dumps({"type": "input.done"}))
            pcm, done = await receive_until_event(socket, "audio.done", "error")
            assert json.loads(await socket.recv())["type"] == "session.done"
        async with websockets.connect(f"ws://127.0.0.1:{port}{WS_PATH}") as socket:
            await socket.send(json.dumps({"type": "input.text", "text": "x" * 70_000}))  # no reference: too big
            too_big = json.loads(await socket.recv())  # said first, then the socket closes
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await socket.recv()
    assert (refused["type"], refused["code"]) == ("error", "invalid_ref_audio")
    assert updated["type"] == "session.updated"
    assert updated["session"]["speech"]["ref_audio"] == f"<{len(reference)} characters>"
    assert done["type"] == "audio.done" and pcm == expected_pcm(1)
    assert standin.requests[0].clone.audio_key.startswith("ref-")
    assert (too_big["type"], too_big["code"]) == ("error", "message_too_big")
    assert closed.value.rcvd.code == 1009


async def _answer_voice_creates(nc, js) -> None:
    """A decode replica's voice-create endpoint, stood in: saves a fixed voice prompt under the asked name."""

    async def answer(msg) -> None:
        request = decode(msg.data, VoiceCreate)
        store = await open_object_store(js, VOICES_STORE)
        record = SavedVoice(name=request.name, model=MODEL, created_at=0.0, duration_s=2.0, x_vector_only=True,
                            ref_text=None, speaker_embedding=b"\0" * 256, ref_codes=None, num_codebooks=16)
        stored = await write_object(store, saved_voice_key(MODEL, request.name), encode(record), "x-vector")
        await msg.respond(encode(VoiceCreated(name=request.name, revision=stored.revision)))

    await nc.subscribe(subjects.voice_create(MODEL), "decode", cb=answer)


async def test_saved_voices_are_created_listed_named_and_deleted(standin, gateway_factory, gateway_bus,
                                                                 base_model_dir):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    await _answer_voice_creates(gateway_bus.nc, gateway_bus.js)
    async with gateway_factory(model_dir=str(base_model_dir)) as client:
        created = await client.post("/v1/audio/voices", json={"name": "Narrator", "audio": reference_uri(),
                                                               "x_vector_only_mode": True})
        bad_name = await client.post("/v1/audio/voices", json={"name": "no spaces", "audio": reference_uri(),
                                                                "x_vector_only_mode": True})
        no_text = await client.post("/v1/audio/voices", json={"name": "n2", "audio": reference_uri()})
        listed = (await client.get("/v1/audio/voices")).json()
        spoken = await client.post("/v1/audio/speech", json={"input": "Hello.", "voice": {"id": "NARRATOR"},
                                                             "response_format": "pcm"})
        deleted = await client.delete("/v1/audio/voices/narrator")
        gone = await client.delete("/v1/audio/voices/narrator")
        after = await client.post("/v1/audio/speech", json={"input": "Hello.", "voice": "narrator"})
    assert created.status_code == 201, created.text
    assert created.json()["id"] == "narrator" and created.json()["mode"] == "x-vector"
    assert bad_name.json()["error"]["code"] == "invalid_value"
    assert no_text.json()["error"]["code"] == "ref_text_required"
    assert [v["id"] for v in listed["voices"]] == ["narrator"] and listed["default"] is None
    assert spoken.status_code == 200 and spoken.content == expected_pcm(1)
    clone = standin.requests[0].clone
    assert (clone.voice, clone.voice_revision, clone.audio_key) == ("narrator", created.json()["revision"], None)
    assert deleted.status_code == 200 and gone.status_code == 404
    assert after.json()["error"]["code"] == "unknown_voice"


async def test_creating_a_voice_without_a_decode_replica_is_a_503(standin, gateway_factory, base_model_dir):
    async with gateway_factory(model_dir=str(base_model_dir)) as client:
        answer = await client.post("/v1/audio/voices", json={"name": "me", "audio": reference_uri(),
                                                             "ref_text": REF_TEXT})
    assert answer.status_code == 503 and "no decode replica" in answer.json()["error"]["message"]
