"""The `single` topology end to end, as a user runs it: `voxmesh up`, three service processes, a real
nats-server, HTTP and WebSocket clients. The offline `generate` is the oracle for the codes."""

from __future__ import annotations

import asyncio
import io
import json
import wave

import subprocess
import sys
from pathlib import Path

import httpx
import nats
import numpy as np
import pytest

from messages import Failed, encode, subjects
from messages.errors import ErrorCode, Stage
from messages.requests import SynthesisRequest
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.support.mesh_client import codes_on_bus, events_of, service_stats, stream_speech, terminal_count
from tests.support.offline_synthesis import synth_codes

TEXTS = ["The quick brown fox.", "Hello there, how are you?", "Streaming speech, one frame at a time."]
MAX_FRAMES = 24
LONG_FRAMES = 48  # fixed length (ignore_eos): long enough that each staggered request overlaps the next


def greedy_body(text: str, voice: str = "vivian") -> dict:
    return {"input": text, "voice": voice, "temperature": 0, "max_new_tokens": LONG_FRAMES, "ignore_eos": True,
            "seed": 7}


def clone_codes(checkpoint, tmp_path, text: str, reference: Path, mode: list[str], frames: int) -> np.ndarray:
    """`voxmesh synth`'s greedy codes in a voice cloned from the `reference` file (`mode`: `--ref-text T` or
    `--x-vector-only`); its audio is left in tmp_path/synth.wav."""
    return _synth(checkpoint, tmp_path, text, ["--ref-audio", str(reference), *mode, "--greedy"], frames)


def _synth(checkpoint, tmp_path, text: str, voice_and_mode: list[str], frames: int) -> np.ndarray:
    codes_file = tmp_path / f"{abs(hash((text, *voice_and_mode, frames)))}.npy"
    subprocess.run([sys.executable, "-m", "services.cli", "synth", "--model", str(checkpoint), "--text", text,
                    *voice_and_mode, "--max-new-tokens", str(frames), "--output", str(tmp_path / "synth.wav"),
                    "--codes-out", str(codes_file)], check=True)
    return np.load(codes_file)


async def test_seeded_sampled_request_equals_offline_synthesis_with_that_seed(mesh, tiny_checkpoint):
    text = "Sampling survives the trip."
    body = {"input": text, "voice": "eric", "seed": 12345, "max_new_tokens": MAX_FRAMES}
    result = await stream_speech(mesh.gateway_url, body)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(mesh.nats_url, result.request_id)
    np.testing.assert_array_equal(codes, synth_codes(tiny_checkpoint, text, "eric", seed=12345))
    greedy = synth_codes(tiny_checkpoint, text, "eric")
    assert not np.array_equal(codes[: len(greedy)], greedy[: len(codes)]), "sampling must differ from greedy"


async def test_staggered_greedy_requests_batch_together_and_equal_offline_synthesis(mesh, tiny_checkpoint):
    results, tasks = [], []
    for text in TEXTS:
        # Stagger on events, not time: the next request starts once the previous one is streaming audio.
        first_audio = asyncio.Event()
        tasks.append(asyncio.create_task(stream_speech(mesh.gateway_url, greedy_body(text), first_audio)))
        await asyncio.wait_for(first_audio.wait(), 120)
    results = await asyncio.gather(*tasks)
    for text, result in zip(TEXTS, results):
        assert result.end["type"] == "audio.done", result.end
        codes, end = await codes_on_bus(mesh.nats_url, result.request_id)
        assert end.reason == "finished"
        assert codes.shape[0] == LONG_FRAMES
        np.testing.assert_array_equal(codes, synth_codes(tiny_checkpoint, text, frames=LONG_FRAMES,
                                                         ignore_eos=True))
        assert len(result.pcm) == 2 * SAMPLES_PER_FRAME * codes.shape[0]
        assert result.end["chunk_count"] == end.seq
    stats = await service_stats(mesh.nats_url, "voxmesh-decode")
    assert max(s.get("max_batch_size", 0) for s in stats) > 1, stats


async def test_http_speech_returns_a_wav_with_request_id_and_one_terminal_event(mesh):
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{mesh.gateway_url}/v1/audio/speech",
                                     json={"model": "tiny", "input": "A short sentence.", "voice": "ryan",
                                           "max_new_tokens": 10, "ignore_eos": True})
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        assert wav.getnframes() == SAMPLES_PER_FRAME * 10
    events = await events_of(mesh.nats_url, request_id)
    kinds = [type(e).__name__ for e in events]
    # Stages publish independently, so only the terminal's place is fixed: it is the last word.
    assert kinds[-1] == "Finished", kinds
    assert {"Accepted", "Started", "FirstFrame", "FirstAudio"} <= set(kinds), kinds
    assert await terminal_count(mesh.nats_url, request_id) == 1


async def test_undecodable_request_is_termed_and_the_next_is_served(mesh):
    nc = await nats.connect(mesh.nats_url)
    try:
        await nc.jetstream().publish(subjects.request("tiny"), b"\x93not a request")
    finally:
        await nc.close()
    result = await stream_speech(mesh.gateway_url, {"input": "Still serving.", "voice": "eric", "max_new_tokens": 6})
    assert result.end["type"] == "audio.done", result.end
    stats = await service_stats(mesh.nats_url, "voxmesh-decode")
    assert max(s.get("messages_termed", 0) for s in stats) >= 1, stats


async def test_a_request_for_a_model_nobody_serves_ends_with_one_unknown_model_terminal(mesh):
    request = SynthesisRequest(id="req_for_another_model", model="qwen3-tts-1_7b", text="Who serves me?")
    nc = await nats.connect(mesh.nats_url)
    try:  # on the served model's subject: a gateway would have refused it up front (test_bad_requests_...)
        await nc.jetstream().publish(subjects.request("tiny"), encode(request))
    finally:
        await nc.close()
    events = await events_of(mesh.nats_url, request.id)
    assert isinstance(events[-1], Failed), events[-1]
    assert (events[-1].code, events[-1].stage) == (ErrorCode.UNKNOWN_MODEL, Stage.DECODE)
    assert await terminal_count(mesh.nats_url, request.id) == 1


@pytest.mark.parametrize("body, code", [
    ({"input": ""}, "empty_input"),
    ({"input": "x" * 4097}, "text_too_long"),
    ({"input": "hi", "voice": "nobody"}, "unknown_voice"),
    ({"input": "hi", "voice": "ryan", "language": "klingon"}, "unknown_language"),
    ({"input": "hi", "model": "qwen3-tts-1_7b"}, "unknown_model"),
])
async def test_bad_requests_get_specific_errors(mesh, body, code):
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{mesh.gateway_url}/v1/audio/speech", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


async def test_voxmesh_events_prints_a_requests_history_and_exits_at_its_terminal(mesh):
    result = await stream_speech(mesh.gateway_url, {"input": "Watch me.", "voice": "ryan", "max_new_tokens": 4})
    assert result.end["type"] == "audio.done"
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "services.cli", "events", "--nats-url", mesh.nats_url,
                         "--request", result.request_id], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(line.split()[1] == result.request_id for line in lines), lines
    kinds = [line.split()[2] for line in lines]
    assert {"accepted", "started", "first_frame", "first_audio"} <= set(kinds[:-1]), kinds
    assert kinds[-1] == "finished" and "chunk_count=" in lines[-1], lines[-1]


async def test_every_service_answers_srv_ping_like_nats_micro_ls(mesh):
    nc = await nats.connect(mesh.nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(subjects.micro_ping(), b"", reply=inbox)
        names = set()
        while not {"voxmesh-gateway", "voxmesh-decode", "voxmesh-vocoder"} <= names:
            reply = json.loads((await sub.next_msg(timeout=10)).data)
            names.add(reply["name"])
    finally:
        await nc.close()
