"""Voice cloning on the real mesh (`voxmesh up` with the tiny base checkpoint): a cloned voice streams over HTTP and
the WebSocket, in both modes; a saved voice speaks exactly as its reference audio does (greedy) without the audio
work; saved voices survive a restart of the mesh and can be deleted."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
import torch
import websockets

from services.model.codec.loader import load_codec_decoder
from tests.support.mesh import Mesh, run_mesh
from tests.support.mesh_client import codes_on_bus, stream_speech
from tests.mesh.test_mesh_e2e import clone_codes
from tests.support.oracle.voice_clone import clone_audio, load_wrapper
from tests.support.reference_audio_files import audio_file, data_uri, reference_uri

pytestmark = pytest.mark.timeout(600)

REF_TEXT = "This is how I sound."
GREEDY = {"seed": 11, "temperature": 0.0, "max_new_tokens": 24, "response_format": "pcm"}


@pytest.fixture(scope="module")
def base_mesh(tiny_base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    with run_mesh(tiny_base_checkpoint, tmp_path_factory.mktemp("voice-mesh-state")) as running:
        yield running


def _speak(mesh: Mesh, **fields) -> httpx.Response:
    body = {"model": "tiny", "input": "Hello there, in a cloned voice."} | GREEDY | fields
    return httpx.post(f"{mesh.gateway_url}/v1/audio/speech", json=body, timeout=120)


def test_a_cloned_voice_streams_over_http_in_both_modes(base_mesh: Mesh):
    reference = reference_uri(seconds=3.0, sample_rate=44100, channels=2)
    body = {"model": "tiny", "input": "Hello there, in a cloned voice.", "ref_audio": reference,
            "ref_text": REF_TEXT, "stream_format": "audio", "response_format": "pcm", "max_new_tokens": 24}
    chunks = []
    with httpx.stream("POST", f"{base_mesh.gateway_url}/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        chunks = [chunk for chunk in response.iter_bytes() if chunk]
    assert sum(len(c) for c in chunks) >= 2 * 1920 * 2 and len(set(b"".join(chunks))) > 8, "audible audio"
    x_vector = _speak(base_mesh, ref_audio=reference, x_vector_only_mode=True)
    assert x_vector.status_code == 200 and len(x_vector.content) >= 2 * 1920 * 2


async def test_a_cloned_voice_streams_over_the_websocket(base_mesh: Mesh):
    url = base_mesh.gateway_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    async with websockets.connect(url, max_size=None) as socket:
        await socket.send(json.dumps({"type": "session.update", "ref_audio": reference_uri(seconds=2.5),
                                      "ref_text": REF_TEXT, "max_new_tokens": 16}))
        assert json.loads(await socket.recv())["type"] == "session.updated"
        await socket.send(json.dumps({"type": "input.text", "text": "One sentence. And another one."}))
        await socket.send(json.dumps({"type": "input.done"}))
        pcm, events = bytearray(), []
        while not events or events[-1]["type"] != "session.done":
            message = await socket.recv()
            if isinstance(message, bytes):
                pcm += message
            else:
                events.append(json.loads(message))
    assert [e["type"] for e in events if e["type"] != "audio.start"] == ["audio.done", "audio.done", "session.done"]
    assert len(pcm) == sum(e["samples"] for e in events if e["type"] == "audio.done") * 2 > 0


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_cloned_codes_equal_offline_synthesis_and_say_takes_a_file(base_mesh: Mesh, tiny_base_checkpoint: Path,
                                                                         tmp_path: Path, x_vector_only: bool):
    reference = tmp_path / "me.flac"
    reference.write_bytes(audio_file(2.5, 48000, fmt="FLAC", seed=5))
    text, mode = "The offline oracle clones too.", ["--x-vector-only"] if x_vector_only else ["--ref-text", REF_TEXT]
    offline_codes = clone_codes(tiny_base_checkpoint, tmp_path, text, reference, mode, frames=20)
    fields = {"x_vector_only_mode": True} if x_vector_only else {"ref_text": REF_TEXT}
    body = {"input": text, "temperature": 0, "max_new_tokens": 20,
            "ref_audio": data_uri(reference.read_bytes(), "audio/flac")}
    result = await stream_speech(base_mesh.gateway_url, body | fields)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(base_mesh.nats_url, result.request_id)
    np.testing.assert_array_equal(codes, offline_codes)
    with wave.open(str(tmp_path / "synth.wav")) as offline:  # an in-context clone's audio continues its reference's
        offline_pcm = np.frombuffer(offline.readframes(offline.getnframes()), dtype="<i2")
    np.testing.assert_allclose(offline_pcm, np.frombuffer(result.pcm, dtype="<i2"), atol=1, rtol=0)
    said = tmp_path / "said.wav"
    subprocess.run([sys.executable, "-m", "services.cli", "say", text, "-o", str(said), "--url",
                    base_mesh.gateway_url, "--ref-audio", str(reference), *mode], check=True)
    with wave.open(str(said)) as audio:
        assert audio.getnframes() > 0 and audio.getframerate() == 24000


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """The vocoder's float -> s16 conversion (AudioChunk.from_float)."""
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_cloned_audio_equals_the_reference_packages(base_mesh: Mesh, tiny_base_checkpoint: Path,
                                                          x_vector_only: bool):
    """The reference decodes an in-context clone's reference frames in front of the generated ones and cuts
    their audio off, so the first audio differs from decoding the generated frames alone: the vocoder primes the
    request's codec state with them (chunk 0's context) and matches it to within one step of 16 bits (the codec
    parity tests' 1e-5). An x-vector clone is the generated frames' audio alone, as before."""
    wav = audio_file(2.5, 24000, seed=9)
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    text, frames = "The reference package decodes this.", 20
    fields = {"x_vector_only_mode": True} if x_vector_only else {"ref_text": REF_TEXT}
    result = await stream_speech(base_mesh.gateway_url, {"input": text, "temperature": 0, "max_new_tokens": frames,
                                                         "ref_audio": data_uri(wav)} | fields)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(base_mesh.nats_url, result.request_id)
    mesh = np.frombuffer(result.pcm, dtype="<i2")
    assert mesh.shape[0] == codes.shape[0] * 1920

    expected = clone_audio(load_wrapper(tiny_base_checkpoint), tiny_base_checkpoint, text, samples, rate,
                           None if x_vector_only else REF_TEXT, x_vector_only, frames)
    # The reference cuts at int(ref / total * samples), which float rounding sometimes puts one sample early.
    assert expected.shape[0] - mesh.shape[0] in ((0,) if x_vector_only else (0, 1))
    np.testing.assert_allclose(mesh, _pcm16(expected[-mesh.shape[0]:]), atol=1, rtol=0)

    alone = _pcm16(load_codec_decoder(tiny_base_checkpoint / "speech_tokenizer").decode(
        torch.from_numpy(codes)).numpy())
    first_frame_gap = int(np.abs(alone[:1920].astype(np.int32) - mesh[:1920]).max())
    assert (first_frame_gap <= 1) == x_vector_only, f"decoded alone, the first frame is off by {first_frame_gap}"


def test_a_saved_voice_speaks_as_its_reference_does_and_survives_a_restart(tiny_base_checkpoint: Path,
                                                                          tmp_path: Path):
    reference = reference_uri(seconds=2.0, sample_rate=22050, seed=3)
    state = tmp_path / "state"
    with run_mesh(tiny_base_checkpoint, state) as mesh:
        created = httpx.post(f"{mesh.gateway_url}/v1/audio/voices", timeout=120,
                             json={"name": "Narrator", "audio": reference, "ref_text": REF_TEXT})
        assert created.status_code == 201, created.text
        from_reference = _speak(mesh, ref_audio=reference, ref_text=REF_TEXT)
        from_saved = _speak(mesh, voice="narrator")
    assert from_reference.status_code == from_saved.status_code == 200, from_saved.text
    assert from_saved.content == from_reference.content, "a saved voice is the same prompt as its reference"
    with run_mesh(tiny_base_checkpoint, state) as mesh:
        listed = httpx.get(f"{mesh.gateway_url}/v1/audio/voices", timeout=30).json()
        after_restart = _speak(mesh, voice="narrator")
        deleted = httpx.delete(f"{mesh.gateway_url}/v1/audio/voices/narrator", timeout=30)
        gone = _speak(mesh, voice="narrator")
    assert [v["id"] for v in listed["voices"]] == ["narrator"]
    assert after_restart.status_code == 200 and after_restart.content == from_saved.content
    assert deleted.status_code == 200
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "unknown_voice"
