"""The bench's HTTP transport, gate, sweep and trials against the real gateway (uvicorn on 127.0.0.1, real
nats-server) with the gateway's stand-in for decode and vocoder.

The stand-in's chunk k carries samples of value 100 (k + 1): chunk 0 (100) is below the audible threshold (104),
chunk 1 (200) above, so on it the first audible sample is exactly chunk 0's length into the stream, later than the
first playable one.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from loadtest.bench.http_speech import STREAMED_PCM_FIELDS, HttpSpeechClient, speech_url
from loadtest.bench.metrics import request_metrics
from messages.errors import ErrorCode, Stage
from tests.support.gateway_standin import SAMPLES_PER_FRAME, Plan, expected_pcm
from tests.support.bench_stubs import SAMPLE_RATE, check_bench_document, run_bench, write_prompts

PLAN = Plan(num_chunks=3, frames_per_chunk=2)
CHUNK_SAMPLES = PLAN.frames_per_chunk * SAMPLES_PER_FRAME
AUDIO_S_PER_REQUEST = PLAN.num_chunks * CHUNK_SAMPLES / SAMPLE_RATE


async def test_http_transport_times_the_body_and_finds_the_first_audible_sample(standin, served_gateway):
    standin.plan = PLAN
    standin.start_consumer()
    async with served_gateway() as port, HttpSpeechClient() as client:
        url = speech_url(f"http://127.0.0.1:{port}")
        record = await client.request(url, {"input": "Time me.", "voice": "ryan", "max_new_tokens": 6}, index=4,
                                      prompt_id="x")
    assert record.error is None, record.error
    assert record.request_id == standin.requests[0].id
    assert sum(chunk.num_samples for chunk in record.chunks) * 2 == len(expected_pcm(PLAN.num_chunks))
    assert record.first_audible.index == CHUNK_SAMPLES, "chunk 0 (value 100) is below -50 dBFS, chunk 1 is not"
    assert record.started_at < record.sent_at <= record.first_byte_at <= record.first_audible.at <= record.ended_at
    metrics = request_metrics(record)
    assert metrics.ttfb_s <= metrics.first_playable_s <= metrics.first_audible_s <= metrics.latency_s
    assert metrics.audio_s == pytest.approx(AUDIO_S_PER_REQUEST)
    sent = standin.requests[0]
    assert sent.max_new_tokens == 6 and sent.text == "Time me."


async def test_http_transport_records_refusals_with_their_status(standin, served_gateway):
    standin.plan = Plan(num_chunks=3, hang_after=1)  # holds the one live request the gateway allows
    standin.start_consumer()
    async with served_gateway(max_live_requests=1) as port, HttpSpeechClient() as client:
        url = speech_url(f"http://127.0.0.1:{port}")
        unknown = await client.request(url, {"input": "Who?", "voice": "nobody"})
        holder = asyncio.create_task(client.request(url, {"input": "Hold.", "voice": "ryan"}, timeout_s=60.0))
        await standin.wait_acked(1)
        refused = await client.request(url, {"input": "One too many.", "voice": "ryan"})
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
    assert (unknown.error.code, unknown.error.http_status) == ("unknown_voice", 400)
    assert not unknown.error.is_overload
    assert (refused.error.code, refused.error.http_status) == ("too_many_requests", 429)
    assert refused.error.is_overload and refused.chunks == () and refused.first_byte_at is None


async def test_http_transport_reports_a_body_cut_after_its_audio_began(standin, served_gateway):
    standin.plan = Plan(num_chunks=5, fail_after=2, failure=(ErrorCode.CAPACITY, Stage.DECODE))
    standin.start_consumer()
    async with served_gateway() as port, HttpSpeechClient() as client:
        record = await client.request(speech_url(f"http://127.0.0.1:{port}"), {"input": "Fail.", "voice": "ryan"})
    assert record.error.code == "connection_closed" and record.error.http_status is None
    assert sum(chunk.num_samples for chunk in record.chunks) == 2 * CHUNK_SAMPLES


async def test_a_realistic_length_http_sweep_passes_every_rate_and_reports_max_sustained_rps(standin, served_gateway,
                                                                                             tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    out = tmp_path / "sweep.json"
    async with served_gateway() as port:
        done = await run_bench("--url", f"http://127.0.0.1:{port}", "--transport", "http", "--mode", "open",
                               "--sweep", "--rate-ladder", "5", "20", "2", "--requests", "3", "--length-mode",
                               "realistic", "--prompts", str(write_prompts(tmp_path)), "--no-plot", "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = check_bench_document(out, levels=[("open", 5.0), ("open", 10.0), ("open", 20.0)], num_requests=3,
                                    audio_s_per_request=AUDIO_S_PER_REQUEST)
    sent = standin.requests[1:]  # after the warm-up
    # "Test sentence number N, spoken briefly." is six words
    assert all(r.min_new_tokens == r.max_new_tokens == round(6 * 6.35) and not r.ignore_eos for r in sent)
    labels = document["public_method"]
    assert (labels["length_mode"], labels["transports"], labels["http_fields"]) == \
        ("realistic", {"mesh": "http"}, STREAMED_PCM_FIELDS)
    assert labels["audible_threshold_dbfs"] == -50.0 and "random weights" in labels["audible_note"]
    target = document["targets"][0]
    assert target["labels"]["transport"] == "http" and target["url"].endswith("/v1/audio/speech")
    for level in target["levels"]:
        assert level["gate"] == {"passed": True, "reasons": []}
        summary = level["summary"]
        assert summary["num_underrun_events"] == 0 and summary["num_inaudible"] == 0
        for request in level["requests"]:
            assert request["audible"] and request["underrun_events"] == 0
            assert request["ttfb_s"] <= request["first_playable_s"] < request["first_audible_s"] <= \
                request["latency_s"]
    assert document["sweep"] == {"stopped_at_rps": None, "not_run_rps": []}
    assert target["max_sustained_rps"]["rps"] == 20.0
    assert target["max_sustained_rps"]["first_audible_s"]["p95"] > 0
    assert "max sustained rps: 20" in done.stdout and "realistic length" in done.stdout


async def test_the_sweep_stops_at_the_first_rate_over_the_p95_bound(standin, served_gateway, tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    out = tmp_path / "sweep.json"
    async with served_gateway() as port:
        done = await run_bench("--url", f"http://127.0.0.1:{port}", "--transport", "http", "--mode", "open",
                               "--sweep", "--rates", "5", "10", "--requests", "2", "--fixed-frames", "6",
                               "--p95-bound-ms", "0.001", "--prompts", str(write_prompts(tmp_path)), "--no-plot",
                               "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    target = document["targets"][0]
    assert [level["level"]["load"] for level in target["levels"]] == [5.0]
    assert target["levels"][0]["gate"] == {"passed": False, "reasons": ["p95_over_bound"]}
    assert document["sweep"] == {"stopped_at_rps": 5.0, "not_run_rps": [10.0]}
    assert target["max_sustained_rps"]["rps"] is None
    assert len(standin.requests) == 1 + 2


async def test_trials_repeat_the_run_with_seeds_and_report_the_median_with_min_max(standin, served_gateway,
                                                                                   tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    out = tmp_path / "trials.json"
    async with served_gateway() as port:
        done = await run_bench("--url", f"http://127.0.0.1:{port}", "--transport", "websocket", "--mode", "open",
                               "--rates", "10", "--requests", "2", "--fixed-frames", "6", "--trials", "2",
                               "--arrival-seed", "5", "--prompts", str(write_prompts(tmp_path)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    trials = document["trials"]
    assert (trials["count"], trials["arrival_seeds"], trials["fresh_mesh"]) == (2, [5, 6], False)
    level = document["targets"][0]["levels"][0]
    summary = level["summary"]
    assert (summary["num_completed"], summary["audio_s"]) == (2, pytest.approx(2 * AUDIO_S_PER_REQUEST))
    assert [trial["targets"][0]["max_sustained_rps"]["rps"] for trial in trials["per_trial"]] == [10.0, 10.0]
    assert level["num_trials"] == 2 and sorted(request["trial"] for request in level["requests"]) == [0, 0, 1, 1]
    low, mid, high = (level[key]["first_audible_s"]["p95"] for key in ("summary_min", "summary", "summary_max"))
    assert low <= mid <= high
    assert len(standin.requests) == 2 * (1 + 2), "each trial warms up once, then runs its level"
    assert out.with_suffix(".png").stat().st_size > 10_000
