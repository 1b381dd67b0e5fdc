"""`voxmesh bench` and the Locust user against the real CPU mesh (`voxmesh up`: nats-server, gateway, decode and
vocoder processes, tiny checkpoint; the tiny base checkpoint for cloned voices), in fixed-length mode so every
request's audio length is known."""

from __future__ import annotations

import json

import pytest

from messages.audio_format import SAMPLES_PER_FRAME
from tests.support.mesh import run_mesh
from loadtest.bench.stages import STAGES
from loadtest.gpu.gpu_mesh_stats import decode_stats
from loadtest.gpu.gpu_mesh_table import bench_table, decode_summary
from tests.support.mesh_client import one_replica_stats, stream_speech
from tests.support.reference_audio_files import audio_file
from tests.support.bench_stubs import (BYTES_PER_SAMPLE, SAMPLE_RATE, check_bench_document, check_locust_stats,
                                      check_png, locust_command, run_bench, run_process, write_prompts)

FRAMES = 6  # fixed length: ignore_eos + max_new_tokens, tiny and quick on two CPU cores
SAMPLES_PER_REQUEST = FRAMES * SAMPLES_PER_FRAME


async def test_bench_run_against_the_cpu_mesh(mesh, tmp_path):
    out = tmp_path / "bench.json"
    done = await run_bench("--url", mesh.gateway_url, "--mode", "both", "--rates", "1", "--concurrency", "1", "2",
                           "--requests", "3", "--fixed-frames", str(FRAMES), "--prompts", str(write_prompts(tmp_path)),
                           "--request-timeout", "120", "--level-timeout", "240", "--out", str(out),
                           "--events-url", mesh.nats_url)
    assert done.returncode == 0, done.stderr
    document = check_bench_document(out, levels=[("open", 1.0), ("closed", 1), ("closed", 2)], num_requests=3,
                                    audio_s_per_request=SAMPLES_PER_REQUEST / SAMPLE_RATE)
    assert document["length_mode"] == "fixed"
    for level in document["targets"][0]["levels"]:
        assert all(request["request_id"] for request in level["requests"])
        assert level["summary"]["rtf"]["count"] == 3
        check_first_packet_stages(level)
    assert "first packet by stage, p50 / p95: connect " in done.stdout, done.stdout
    table = "\n".join(bench_table([document]))  # the GPU run's table.md
    assert "| level | requests | connect | submit | queue | first_frame | first_audio | delivery |" in table, table
    assert "\n| closed x2 | 3 | " in table, table
    check_png(out.with_suffix(".png"))


def check_first_packet_stages(level: dict) -> None:
    """Every request's first packet split into the six stages read back from EVENTS: they add up to it, and each
    stage whose two ends are causally ordered lasted no less than zero."""
    stages = level["first_packet_stages"]
    assert stages["num_requests"] == 3, stages
    assert list(stages)[1:] == list(STAGES)
    for request in level["requests"]:
        parts = request["first_packet_stages"]
        assert sum(parts.values()) == pytest.approx(request["first_packet_s"], abs=1e-6), request
        # The gateway stamps Accepted once REQUESTS has acknowledged the request, which decode's Started may beat by
        # a hair; from the client's send to Started is ordered, as is every other stage.
        ordered = [parts["connect"], parts["submit"] + parts["queue"], parts["first_frame"], parts["first_audio"],
                   parts["delivery"]]
        assert min(ordered) >= 0, request
        assert parts["first_frame"] > 0 and parts["first_audio"] > 0, request
    total = sum(stages[stage]["mean"] for stage in STAGES)
    assert total == pytest.approx(level["summary"]["first_packet_s"]["mean"], abs=1e-6), stages


async def test_the_gpu_run_reads_decode_and_vocoder_stats_and_tabulates_their_timings(mesh, tmp_path):
    """What gpu_mesh_run.sh does after the bench: decode's STATS with the vocoder's codec fields, then the line of its
    table that says where chunks waited."""
    result = await stream_speech(mesh.gateway_url, {"input": "Timed once more.", "max_new_tokens": FRAMES,
                                                    "ignore_eos": True})
    assert result.end["type"] == "audio.done", result.end
    stats = await decode_stats(mesh.nats_url)
    assert stats["steps"] > 0 and stats["mean_batch_size"] > 0, stats
    # decode's engine reports each step's host launch time (its device times need CUDA events)
    assert stats["step_seconds"]["launch"]["count"] >= 1, stats["step_seconds"]
    assert stats["step_seconds"]["device_decode"]["count"] == 0, stats["step_seconds"]
    codec = stats["vocoder"]
    assert codec["codec_seconds"]["call"]["count"] == codec["codec_calls"] > 0, codec
    assert codec["codec_seconds"]["chunk"]["count"] >= codec["codec_calls"], codec
    path = tmp_path / "decode_stats.json"
    path.write_text(json.dumps(stats))
    summary = decode_summary(path)
    assert "; vocoder codec call " in summary and ", chunk " in summary, summary
    assert codec["codec_passes"] >= codec["codec_calls"] and codec["codec_row_frames"] >= FRAMES, codec
    assert f"; codec passes {codec['codec_passes']} (" in summary, summary
    assert "steps (device, idle stream, host launch) launch " in summary, summary


async def test_locust_run_against_the_cpu_mesh(mesh, tmp_path):
    stats = tmp_path / "locust"
    done = await run_process(*locust_command(mesh.gateway_url, stats, write_prompts(tmp_path), users=2, streams=4,
                                             run_time="120s", extra=("--fixed-frames", str(FRAMES))))
    assert done.returncode == 0, done.stderr
    check_locust_stats(stats.with_suffix(".json"), num_streams=4,
                       bytes_per_stream=SAMPLES_PER_REQUEST * BYTES_PER_SAMPLE)


@pytest.fixture(scope="module")
def base_mesh(tiny_base_checkpoint, tmp_path_factory):
    with run_mesh(tiny_base_checkpoint, tmp_path_factory.mktemp("bench-base-mesh")) as running:
        yield running


async def _prompts_computed(mesh) -> int:
    return (await one_replica_stats(mesh.nats_url, "voxmesh-decode"))["voice_prompts_computed"]


async def test_bench_clones_a_voice_once_or_for_every_request(base_mesh, tmp_path):
    """`--ref-audio` on a base checkpoint: every request is a clone; the same file is computed once (its content is
    the cache's key), `--distinct-references` makes every request pay the audio work."""
    reference = tmp_path / "me.wav"
    reference.write_bytes(audio_file(2.0, 24000, seed=4))
    common = ("--url", base_mesh.gateway_url, "--mode", "closed", "--concurrency", "1", "--requests", "2",
              "--fixed-frames", str(FRAMES), "--prompts", str(write_prompts(tmp_path)), "--request-timeout", "120",
              "--level-timeout", "240", "--no-plot", "--ref-audio", str(reference), "--ref-text", "This is me.")
    before = await _prompts_computed(base_mesh)
    done = await run_bench(*common, "--out", str(tmp_path / "same.json"))
    assert done.returncode == 0, done.stderr
    check_bench_document(tmp_path / "same.json", levels=[("closed", 1)], num_requests=2,
                         audio_s_per_request=SAMPLES_PER_REQUEST / SAMPLE_RATE)
    assert await _prompts_computed(base_mesh) == before + 1, "warm-up and both requests: one reference, one prompt"
    done = await run_bench(*common, "--distinct-references", "--out", str(tmp_path / "distinct.json"))
    assert done.returncode == 0, done.stderr
    document = check_bench_document(tmp_path / "distinct.json", levels=[("closed", 1)], num_requests=2,
                                    audio_s_per_request=SAMPLES_PER_REQUEST / SAMPLE_RATE)
    assert document["config"]["request"]["reference"]["distinct"] is True, document["config"]["request"]
    assert await _prompts_computed(base_mesh) == before + 1 + 3, "the warm-up and each request computed their own"
