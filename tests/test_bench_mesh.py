"""`voxmesh bench` and the Locust user against the real CPU mesh (`voxmesh up`: nats-server, gateway, decode and
vocoder processes, tiny checkpoint), in fixed-length mode so every request's audio length is known."""

from __future__ import annotations

from messages.audio_format import SAMPLES_PER_FRAME
from tests.test_bench_support import (BYTES_PER_SAMPLE, SAMPLE_RATE, check_bench_document, check_locust_stats,
                                      check_png, locust_command, run_bench, run_process, write_prompts)

FRAMES = 6  # fixed length: ignore_eos + max_new_tokens, tiny and quick on two CPU cores
SAMPLES_PER_REQUEST = FRAMES * SAMPLES_PER_FRAME


async def test_bench_run_against_the_cpu_mesh(mesh, tmp_path):
    out = tmp_path / "bench.json"
    done = await run_bench("--url", mesh.gateway_url, "--mode", "both", "--rates", "1", "--concurrency", "1", "2",
                           "--requests", "3", "--fixed-frames", str(FRAMES), "--prompts", str(write_prompts(tmp_path)),
                           "--request-timeout", "120", "--level-timeout", "240", "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = check_bench_document(out, levels=[("open", 1.0), ("closed", 1), ("closed", 2)], num_requests=3,
                                    audio_s_per_request=SAMPLES_PER_REQUEST / SAMPLE_RATE)
    assert document["length_mode"] == "fixed"
    for level in document["targets"][0]["levels"]:
        assert all(request["request_id"] for request in level["requests"])
        assert level["summary"]["rtf"]["count"] == 3
    check_png(out.with_suffix(".png"))


async def test_locust_run_against_the_cpu_mesh(mesh, tmp_path):
    stats = tmp_path / "locust"
    done = await run_process(*locust_command(mesh.gateway_url, stats, write_prompts(tmp_path), users=2, streams=4,
                                             run_time="120s", extra=("--fixed-frames", str(FRAMES))))
    assert done.returncode == 0, done.stderr
    check_locust_stats(stats.with_suffix(".json"), num_streams=4,
                       bytes_per_stream=SAMPLES_PER_REQUEST * BYTES_PER_SAMPLE)
