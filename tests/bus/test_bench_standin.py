"""The bench's client, `voxmesh bench` and the Locust user against the real gateway (uvicorn on 127.0.0.1, real
nats-server) with the gateway's test stand-in for decode and vocoder (scripted chunks: exact audio known)."""

from __future__ import annotations

import socket

import pytest

from loadtest.bench.client import STREAM_PATH, stream_request
from loadtest.bench.metrics import request_metrics
from messages.errors import ErrorCode, Stage
from tests.support.gateway_standin import SAMPLES_PER_FRAME, Plan
from tests.support.bench_stubs import (BYTES_PER_SAMPLE, SAMPLE_RATE, check_bench_document, check_locust_stats,
                                      check_png, locust_command, run_bench, run_process, write_prompts)

PLAN = Plan(num_chunks=3, frames_per_chunk=2)
SAMPLES_PER_REQUEST = PLAN.num_chunks * PLAN.frames_per_chunk * SAMPLES_PER_FRAME
AUDIO_S_PER_REQUEST = SAMPLES_PER_REQUEST / SAMPLE_RATE


def ws_url(port: int) -> str:
    return f"ws://127.0.0.1:{port}{STREAM_PATH}"


async def test_client_records_every_chunk_of_a_stream(standin, served_gateway):
    standin.plan = Plan(num_chunks=4, frames_per_chunk=2, order=(1, 0, 3, 2))
    standin.start_consumer()
    async with served_gateway() as port:
        record = await stream_request(ws_url(port), {"input": "Time me.", "voice": "ryan"}, index=7, prompt_id="x")
    assert record.error is None and (record.index, record.prompt_id) == (7, "x")
    assert record.request_id == standin.requests[0].id
    assert [chunk.num_samples for chunk in record.chunks] == [2 * SAMPLES_PER_FRAME] * 4
    assert record.started_at < record.sent_at <= record.chunks[0].at <= record.chunks[-1].at <= record.ended_at
    metrics = request_metrics(record)
    assert metrics.ok and metrics.audio_s == pytest.approx(4 * 2 * SAMPLES_PER_FRAME / SAMPLE_RATE)
    assert 0 < metrics.first_packet_s <= metrics.latency_s


async def test_client_keeps_the_audio_and_the_error_of_a_stream_failed_midway(standin, served_gateway):
    standin.plan = Plan(num_chunks=5, fail_after=2, failure=(ErrorCode.CAPACITY, Stage.DECODE))
    standin.start_consumer()
    async with served_gateway() as port:
        record = await stream_request(ws_url(port), {"input": "Fail halfway.", "voice": "ryan"})
    assert (record.error.code, record.error.stage) == ("capacity", "decode")
    assert len(record.chunks) == 2 and request_metrics(record).first_packet_s is not None


async def test_client_records_a_refused_request(standin, served_gateway):
    async with served_gateway() as port:
        record = await stream_request(ws_url(port), {"input": "Who?", "voice": "nobody"})
    assert record.error.code == "unknown_voice" and record.chunks == ()


async def test_client_records_a_gateway_that_is_not_there():
    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        record = await stream_request(ws_url(bound.getsockname()[1]), {"input": "Anyone?"}, timeout_s=5.0)
    assert record.error.code == "connect_failed" and record.sent_at is None


async def test_bench_sweeps_open_and_closed_loop_and_writes_json_and_plot(standin, served_gateway, tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    out = tmp_path / "bench.json"
    async with served_gateway() as port:
        done = await run_bench("--url", f"http://127.0.0.1:{port}", "--mode", "both", "--rates", "20",
                               "--concurrency", "1", "3", "--requests", "4", "--prompts", str(write_prompts(tmp_path)),
                               "--fixed-frames", "6", "--slo-first-packet", "2.0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = check_bench_document(out, levels=[("open", 20.0), ("closed", 1), ("closed", 3)], num_requests=4,
                                    audio_s_per_request=AUDIO_S_PER_REQUEST)
    assert (document["length_mode"], document["config"]["request"]["fixed_frames"]) == ("fixed", 6)
    assert "ignore_eos" in document["length"] and document["comparison"] is None
    sent = standin.requests[1:]  # the first was the warm-up
    assert len(sent) == 12 and all(r.ignore_eos and r.max_new_tokens == 6 for r in sent)
    check_png(out.with_suffix(".png"))
    assert done.stderr.count("4/4 ok, 0 failed") == 3  # the progress line of each level
    assert "open 20/s" in done.stdout and "closed x3" in done.stdout


async def test_comparison_alternates_two_gateways_and_reports_ratios(standin, served_gateway, tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    out = tmp_path / "compare.json"
    async with served_gateway() as port_a, served_gateway(replica="gateway-test-b") as port_b:
        done = await run_bench("--url", f"http://127.0.0.1:{port_a}", "--compare-url", f"http://localhost:{port_b}",
                               "--mode", "closed", "--concurrency", "1", "2", "--requests", "2", "--warmup", "0",
                               "--prompts", str(write_prompts(tmp_path)), "--out", str(out), "--no-plot")
    assert done.returncode == 0, done.stderr
    document = check_bench_document(out, levels=[("closed", 1), ("closed", 2)], num_requests=2,
                                    audio_s_per_request=AUDIO_S_PER_REQUEST)
    assert [target["label"] for target in document["targets"]] == ["baseline", "candidate"]
    comparison = document["comparison"]
    assert (comparison["baseline"], comparison["candidate"]) == ("baseline", "candidate")
    figures = comparison["levels"][0]["figures"]["audio_s_per_s"]
    assert figures["ratio"] == pytest.approx(figures["candidate"] / figures["baseline"])
    # Level order alternates: baseline then candidate, then candidate then baseline.
    labels = [line.split("]")[0].strip("[") for line in done.stderr.splitlines() if line.startswith("[")]
    assert labels == ["baseline", "candidate", "candidate", "baseline"]
    assert not out.with_suffix(".png").exists()


LOCUST_ENDS_WITHIN_S = 120.0
"""Six short streams from the stand-in and Locust's start and stop take seconds; a run that waits for its run time
(an hour) instead is cut here and fails."""


async def test_locust_user_streams_the_requested_number_of_requests(standin, served_gateway, tmp_path):
    standin.plan = PLAN
    standin.start_consumer()
    stats = tmp_path / "locust"
    async with served_gateway() as port:  # the run ends with its sixth stream, long before its run time
        done = await run_process(*locust_command(f"http://127.0.0.1:{port}", stats, write_prompts(tmp_path),
                                                 users=2, streams=6, run_time="1h", extra=("--fixed-frames", "6")),
                                 timeout_s=LOCUST_ENDS_WITHIN_S)
    assert done.returncode == 0, done.stderr
    check_locust_stats(stats.with_suffix(".json"), num_streams=6,
                       bytes_per_stream=SAMPLES_PER_REQUEST * BYTES_PER_SAMPLE)
    assert len(standin.requests) == 6 and all(r.ignore_eos for r in standin.requests)


async def test_bench_stops_when_a_warm_up_request_fails(standin, served_gateway, tmp_path):
    async with served_gateway() as port:
        done = await run_bench("--url", f"http://127.0.0.1:{port}", "--voice", "nobody", "--mode", "closed",
                               "--concurrency", "1", "--requests", "1", "--prompts", str(write_prompts(tmp_path)),
                               "--out", str(tmp_path / "never.json"))
    assert done.returncode == 2
    assert "warmup_failed" in done.stderr and "unknown_voice" in done.stderr
    assert not (tmp_path / "never.json").exists()
