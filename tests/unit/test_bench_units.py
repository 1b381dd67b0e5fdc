"""The bench's parts that need no server: URLs and the loopback rule, prompts, request shapes, load levels, the
load generators' bounds, the stream protocol, and the CLI's refusals."""

from __future__ import annotations

import asyncio
import json
import random

import numpy as np
import pytest

from loadtest.bench.client import StreamRecorder, TargetError, is_loopback_host, stream_url
from loadtest.bench.loadgen import run_closed_loop, run_open_loop
from loadtest.bench.metrics import StreamRecord
from loadtest.bench.workload import (
    DEFAULT_PROMPTS,
    Level,
    LoadError,
    PayloadError,
    PromptsError,
    RequestShape,
    fixed_sample,
    load_prompts,
    plan_levels,
    prompt_for,
)
from messages.audio_format import SAMPLE_RATE
from services.cli import bench as bench_cli


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/audio/speech/stream"),
    ("https://localhost:8443/", "wss://localhost:8443/v1/audio/speech/stream"),
    ("ws://127.8.9.10:1/v1/audio/speech/stream", "ws://127.8.9.10:1/v1/audio/speech/stream"),
    ("http://[::1]:8000", "ws://[::1]:8000/v1/audio/speech/stream"),
])
def test_loopback_gateways_map_to_the_stream_endpoint(url, expected):
    assert stream_url(url) == expected


@pytest.mark.parametrize("host", ["10.0.0.5", "192.168.1.2", "0.0.0.0", "example.com", "127.0.0.1.example.com"])
def test_other_hosts_are_refused_unless_allowed(host):
    with pytest.raises(TargetError) as refused:
        stream_url(f"http://{host}:8000")
    assert refused.value.code == "not_loopback" and "--allow-remote" in refused.value.message
    assert stream_url(f"http://{host}:8000", allow_remote=True).startswith(f"ws://{host}:8000/")
    assert not is_loopback_host(host)


def test_a_malformed_url_is_refused():
    with pytest.raises(TargetError) as refused:
        stream_url("127.0.0.1:8000")
    assert refused.value.code == "invalid_url"


def test_prompts_load_in_a_fixed_shuffled_order(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("# comment\n" + "".join(f"id{n}\ttext {n}\n" for n in range(10)) + "\n")
    prompts = load_prompts(path)
    assert [p.id for p in prompts] == [f"id{n}" for n in range(10)]
    sample = fixed_sample(prompts)
    expected = list(prompts)
    random.Random(0).shuffle(expected)
    assert sample == expected and sample != prompts
    assert prompt_for(sample, 12) == sample[2]


def test_the_default_prompts_file_is_the_shared_english_set():
    if not DEFAULT_PROMPTS.exists():
        pytest.skip(f"{DEFAULT_PROMPTS} is not on this machine")
    prompts = load_prompts()
    assert len(prompts) > 100 and all(p.text for p in prompts)


def test_a_malformed_prompts_file_names_the_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a\tfine\nno tab here\n")
    with pytest.raises(PromptsError, match=r"bad.tsv:2: expected `id<TAB>text`"):
        load_prompts(path)
    with pytest.raises(PromptsError, match="cannot read"):
        load_prompts(tmp_path / "missing.tsv")


def test_fixed_length_requests_ask_for_ignore_eos_and_a_frame_count():
    shape = RequestShape(voice="ryan", fixed_frames=48, seed=10)
    assert shape.payload("Hi.", 3) == {"input": "Hi.", "language": "auto", "seed": 13, "voice": "ryan",
                                       "ignore_eos": True, "max_new_tokens": 48}
    assert shape.length_mode == "fixed" and "max_new_tokens=48" in shape.describe_length()
    natural = RequestShape(voice=None)
    assert "voice" not in natural.payload("Hi.", 0) and "ignore_eos" not in natural.payload("Hi.", 0)
    assert natural.length_mode == "natural"
    with pytest.raises(PayloadError, match="fixed_frames"):
        RequestShape(fixed_frames=0)


def test_levels_run_open_then_closed_in_ascending_load():
    levels = plan_levels(("closed", "open"), rates=(2.0, 0.5), concurrencies=(8, 1))
    assert levels == [Level("open", 0.5, 32), Level("open", 2.0, 32), Level("closed", 1, 16), Level("closed", 8, 16)]
    assert [level.num_requests for level in plan_levels(("closed",), concurrencies=(32,))] == [64]
    assert plan_levels(("open",), rates=(1.0,), num_requests=3) == [Level("open", 1.0, 3)]
    with pytest.raises(LoadError, match="positive"):
        plan_levels(("open",), rates=(0.0,))


def _finished_record(index: int, at: float) -> StreamRecord:
    return StreamRecord(index=index, prompt_id="p", started_at=at, sent_at=at, ended_at=at, chunks=(),
                        sample_rate=SAMPLE_RATE)


async def test_closed_loop_sends_exactly_n_requests_with_at_most_c_in_flight():
    in_flight, peak = 0, 0
    release = asyncio.Event()

    async def send(index: int, deadline: float) -> StreamRecord:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if peak == 3:
            release.set()  # every client is busy at once: let them all go
        await release.wait()
        in_flight -= 1
        return _finished_record(index, 0.0)

    run = await run_closed_loop(send, concurrency=3, num_requests=7, time_limit_s=30.0)
    assert [record.index for record in run.records] == list(range(7)) and run.num_not_sent == 0
    assert peak == 3


async def test_open_loop_stops_sending_at_its_time_limit():
    sent = []

    async def send(index: int, deadline: float) -> StreamRecord:
        sent.append(index)
        return _finished_record(index, 0.0)

    # At 0.01 requests/s the second arrival is (almost surely, and with this seed surely) past a 0.2 s limit.
    run = await run_open_loop(send, rate=0.01, num_requests=5, time_limit_s=0.2, rng=random.Random(0))
    assert sent == [0] and run.num_not_sent == 4
    with pytest.raises(LoadError, match="rate"):
        await run_open_loop(send, rate=0.0, num_requests=1, time_limit_s=1.0, rng=random.Random(0))


def test_recorder_checks_the_announced_sample_count():
    recorder = StreamRecorder(0, "p", started_at=1.0)
    recorder.on_message(json.dumps({"type": "audio.start", "request_id": "r1", "sample_rate": SAMPLE_RATE}), 1.1)
    recorder.on_message(b"\x00\x00" * 100, 1.2)
    assert recorder.on_message(json.dumps({"type": "audio.done", "samples": 150}), 1.3)
    record = recorder.record()
    assert record.error.code == "incomplete_audio" and record.request_id == "r1" and record.ended_at == 1.3


def test_recorder_refuses_audio_before_the_start_event_and_odd_sized_frames():
    early = StreamRecorder(0, "p", started_at=0.0)
    assert early.on_message(b"\x00\x00", 0.1)
    assert early.record().error.code == "protocol_error"
    odd = StreamRecorder(0, "p", started_at=0.0)
    odd.on_message(json.dumps({"type": "audio.start"}), 0.1)
    assert odd.on_message(b"\x00\x00\x00", 0.2) and odd.record().error.code == "protocol_error"


def test_cli_refuses_a_non_loopback_gateway_before_sending_anything(capsys):
    assert bench_cli.main(["--url", "http://10.1.2.3:8000", "--warmup", "0"]) == 2
    assert "not_loopback" in capsys.readouterr().err


def test_cli_refuses_two_targets_with_one_label(capsys):
    args = ["--url", "http://127.0.0.1:1", "--compare-url", "http://127.0.0.1:2", "--label", "x",
            "--compare-label", "x"]
    assert bench_cli.main(args) == 2
    assert "invalid_targets" in capsys.readouterr().err


def _reference_file(tmp_path, rate: int = 16000, channels: int = 2):
    import soundfile

    path = tmp_path / "me.flac"
    tone = 0.3 * np.sin(np.arange(rate) * 2 * np.pi * 220 / rate, dtype=np.float64)
    soundfile.write(str(path), np.stack([tone] * channels, axis=1), rate, format="FLAC")
    return path


def _audio_of(fields: dict) -> bytes:
    import base64

    prefix = "data:audio/wav;base64,"
    assert fields["ref_audio"].startswith(prefix)
    return base64.b64decode(fields["ref_audio"][len(prefix):])


def test_a_reference_voice_goes_with_every_request_once_or_distinct(tmp_path):
    import io
    import wave

    from loadtest.bench.reference_voice import ReferenceVoice

    path = _reference_file(tmp_path)
    same = ReferenceVoice.from_file(path, "This is how I sound.", x_vector_only=False, distinct=False)
    shape = RequestShape(voice=None, fixed_frames=8, reference=same)
    first, second = shape.payload("Hello.", 0), shape.payload("Hello.", 1)
    assert first["ref_text"] == "This is how I sound." and "voice" not in first and "x_vector_only_mode" not in first
    assert _audio_of(first) == _audio_of(second), "one file, one content key: the voice is computed once"
    with wave.open(io.BytesIO(_audio_of(first))) as audio:  # mono 16-bit WAV at the file's rate, every sample
        assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate(), audio.getnframes()) == (1, 2, 16000,
                                                                                                          16000)
    distinct = ReferenceVoice.from_file(path, None, x_vector_only=True, distinct=True)
    payloads = [RequestShape(voice=None, reference=distinct).payload("Hello.", index) for index in (0, 1, 0)]
    assert len({_audio_of(p) for p in payloads}) == 3, "every request pays the audio work (index 0 twice too)"
    original = _samples_of(first)
    leads = []
    for payload in payloads:  # the voice after its own lead-in silence: other codec frames
        samples = _samples_of(payload)
        lead = len(samples) - len(original)
        assert 1 <= lead <= 1 + 7 * 1023 and (lead - 1) % 7 == 0 and not samples[:lead].any(), lead
        np.testing.assert_array_equal(samples[lead:], original)
        leads.append(lead)
    assert len(set(leads)) == 3
    assert all(p["x_vector_only_mode"] is True and "ref_text" not in p for p in payloads)
    assert RequestShape(reference=distinct).to_dict()["reference"] == {
        "source": "me.flac", "seconds": 1.0, "sample_rate": 16000, "mode": "x-vector", "distinct": True}


def _samples_of(fields: dict) -> np.ndarray:
    import io
    import wave

    with wave.open(io.BytesIO(_audio_of(fields))) as audio:
        return np.frombuffer(audio.readframes(audio.getnframes()), dtype="<i2")


def test_a_reference_voice_without_its_transcript_or_audio_is_refused(tmp_path):
    from loadtest.bench.reference_voice import ReferenceVoice

    with pytest.raises(PayloadError, match="--ref-text"):
        ReferenceVoice.from_file(_reference_file(tmp_path), None, x_vector_only=False, distinct=False)
    (tmp_path / "noise.wav").write_bytes(b"not audio at all")
    with pytest.raises(PayloadError, match="cannot read the reference audio"):
        ReferenceVoice.from_file(tmp_path / "noise.wav", None, x_vector_only=True, distinct=False)
