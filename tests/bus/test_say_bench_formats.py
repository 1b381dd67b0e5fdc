"""`voxmesh say --sample-rate` and `voxmesh bench --sample-rate --response-format`, as real processes, against a
small HTTP server on 127.0.0.1 that answers the speech API with known audio at the asked rate
(tests/support/speech_file_server.py): what they send, what they write, what they measure, and that a rate other
than the one asked fails them. No nats-server: the server stands for the gateway's side of those fields."""

from __future__ import annotations

import json
import sys
import wave

import pytest

from tests.support.bench_stubs import run_bench, run_process, write_prompts
from tests.support.encoded_audio import SILENT_S, TONE_S, encode, signal
from tests.support.speech_file_server import speech_file_server

pytestmark = pytest.mark.timeout(300)
AUDIO_S = SILENT_S + TONE_S


async def say(*args: str):
    return await run_process(sys.executable, "-m", "services.cli", "say", *args, timeout_s=120.0)


async def test_say_writes_a_wav_at_the_rate_it_asked_for(tmp_path):
    out = tmp_path / "said.wav"
    async with speech_file_server() as server:
        said = await say("Hello there.", "-o", str(out), "--url", server.url, "--sample-rate", "16000")
    assert said.returncode == 0, said.stderr
    assert server.bodies[0]["sample_rate"] == 16000 and server.bodies[0]["response_format"] == "wav"
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        assert wav.readframes(wav.getnframes()) == signal(16000).tobytes()
    assert "wav at 16000 Hz" in said.stdout


async def test_say_takes_the_format_from_the_file_name_and_keeps_the_bytes(tmp_path):
    out = tmp_path / "said.mp3"
    raw = tmp_path / "said.pcm"
    async with speech_file_server() as server:
        said = await say("Hello.", "-o", str(out), "--url", server.url, "--sample-rate", "22050")
        pcm = await say("Hello.", "-o", str(raw), "--url", server.url, "--response-format", "pcm", "--sample-rate",
                        "8000")
    assert said.returncode == 0 and pcm.returncode == 0, said.stderr + pcm.stderr
    assert [body["response_format"] for body in server.bodies] == ["mp3", "pcm"]
    assert out.read_bytes() == encode("mp3", signal(22050), 22050)
    assert raw.read_bytes() == signal(8000).tobytes()
    assert "aplay -f S16_LE -r 8000 -c 1" in pcm.stdout


async def test_say_fails_on_audio_at_another_rate_than_asked_and_on_a_refused_rate(tmp_path):
    async with speech_file_server() as server:
        server.served_rate = 24000  # a server that ignores the field
        ignored = await say("Hello.", "-o", str(tmp_path / "a.wav"), "--url", server.url, "--sample-rate", "16000")
        server.served_rate = None
        refused = await say("Hello.", "-o", str(tmp_path / "b.opus"), "--url", server.url, "--sample-rate", "22050")
    assert ignored.returncode == 1 and "asked for 16000 Hz, the gateway sent 24000 Hz" in ignored.stderr
    assert refused.returncode == 1 and "unsupported_value" in refused.stderr


async def test_bench_measures_mp3_at_16_khz_as_it_measures_pcm(tmp_path):
    out = tmp_path / "bench.json"
    async with speech_file_server() as server:
        done = await run_bench("--url", server.url, "--transport", "http", "--response-format", "mp3",
                               "--sample-rate", "16000", "--mode", "open", "--rates", "20", "--requests", "4",
                               "--prompts", str(write_prompts(tmp_path)), "--no-plot", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert all(body["response_format"] == "mp3" and body["sample_rate"] == 16000 and body["stream"]
               for body in server.bodies) and len(server.bodies) == 5  # one warm-up, four measured
    document = json.loads(out.read_text())
    (target,) = document["targets"]
    assert (target["labels"]["response_format"], target["labels"]["sample_rate"]) == ("mp3", 16000)
    assert document["config"]["request"]["sample_rate"] == 16000
    assert document["public_method"]["http_fields"]["response_format"] == "mp3"
    (level,) = target["levels"]
    assert level["summary"]["num_completed"] == 4, level["summary"]["errors"]
    for request in level["requests"]:
        # LAME's priming and padding add up to a tenth of a second at most.
        assert AUDIO_S <= request["audio_s"] <= AUDIO_S + 0.1, request
        assert request["ttfb_s"] <= request["first_playable_s"] <= request["first_audible_s"] <= request["latency_s"]
    assert "mesh public method (http, mp3 at 16000 Hz, " in done.stdout, done.stdout


async def test_bench_records_audio_at_another_rate_than_asked_as_a_failure(tmp_path):
    out = tmp_path / "bench.json"
    async with speech_file_server() as server:
        server.served_rate = 24000
        done = await run_bench("--url", server.url, "--transport", "http", "--response-format", "flac",
                               "--sample-rate", "16000", "--mode", "closed", "--concurrency", "1", "--requests", "2",
                               "--warmup", "0", "--prompts", str(write_prompts(tmp_path)), "--no-plot", "--out",
                               str(out))
    assert done.returncode == 0, done.stderr
    (level,) = json.loads(out.read_text())["targets"][0]["levels"]
    assert level["summary"]["errors"] == {"rate_mismatch": 2}
