"""The public open-loop method end to end on the real CPU mesh (`voxmesh up`, tiny random checkpoint): the HTTP
transport with the realistic length mode, and two trials each on a fresh mesh the bench starts and stops itself.

Short prompts keep the realistic lengths small (13 and 19 frames) for two shared CPU cores; whether a level passes
the gate there says nothing, so the tests check that every figure is there, labelled and consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench.fresh_mesh import MeshLauncher, MeshStartError
from loadtest.bench.length_mode import realistic_frames
from loadtest.bench.stages import STAGES
from messages.audio_format import FRAMES_PER_SECOND
from tests.support.bench_stubs import bench_command, run_bench, run_process

PROMPTS = {"p0": "Hello there.", "p1": "Good morning, Sam."}
GATE_REASONS = {"incomplete", "error", "http_429", "underrun", "inaudible", "p95_over_bound"}


def write_short_prompts(directory: Path) -> Path:
    path = directory / "short.tsv"
    path.write_text("".join(f"{key}\t{text}\n" for key, text in PROMPTS.items()))
    return path


def check_public_level(level: dict) -> None:
    """Every request complete, of its realistic length, with TTFB <= first playable <= first audible <= end, and
    the level's gate consistent with its figures."""
    for request in level["requests"]:
        assert request["ok"], request
        frames = realistic_frames(PROMPTS[request["prompt_id"]])
        assert request["audio_s"] == pytest.approx(frames / FRAMES_PER_SECOND)
        assert request["audible"], "random weights speak noise-like audio, well above -50 dBFS"
        assert 0 < request["ttfb_s"] <= request["first_playable_s"] <= request["first_audible_s"] <= \
            request["latency_s"]
        assert request["underrun_events"] >= 0 and request["stall_s"] >= 0
    summary, gate = level["summary"], level["gate"]
    assert set(gate["reasons"]) <= GATE_REASONS and gate["passed"] == (not gate["reasons"])
    if "num_trials" not in level:  # one run: its own figures decide (combined trials hold medians)
        assert ("underrun" in gate["reasons"]) == (summary["num_underrun_events"] > 0)
    assert summary["first_audible_s"]["count"] == summary["num_completed"]


async def test_http_transport_with_realistic_lengths_on_the_cpu_mesh(mesh, tmp_path):
    out = tmp_path / "public.json"
    done = await run_bench("--url", mesh.gateway_url, "--transport", "http", "--mode", "open", "--sweep", "--rates",
                           "0.5", "--requests", "2", "--length-mode", "realistic", "--prompts",
                           str(write_short_prompts(tmp_path)), "--request-timeout", "120", "--level-timeout", "240",
                           "--no-plot", "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["length_mode"] == "realistic" and document["public_method"]["transports"] == {"mesh": "http"}
    target = document["targets"][0]
    (level,) = target["levels"]
    assert level["summary"]["num_completed"] == 2
    check_public_level(level)
    assert target["max_sustained_rps"]["rps"] == (0.5 if level["gate"]["passed"] else None)
    assert "public method (http, pcm, realistic length" in done.stdout


async def test_two_trials_each_on_a_fresh_mesh(tiny_checkpoint, tmp_path):
    out, logs = tmp_path / "trials.json", tmp_path / "mesh-logs"
    done = await run_process(*bench_command(
        "--fresh-mesh", f"--up-args=--model {tiny_checkpoint}", "--mesh-log-dir", str(logs), "--trials", "2",
        "--transport", "http", "--mode", "open", "--rates", "1", "--requests", "1", "--length-mode", "realistic",
        "--prompts", str(write_short_prompts(tmp_path)), "--request-timeout", "120", "--no-plot", "--out", str(out)),
        timeout_s=400.0)
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    trials = document["trials"]
    assert (trials["count"], trials["fresh_mesh"], trials["arrival_seeds"]) == (2, True, [0, 1])
    urls = [trial["targets"][0]["url"] for trial in trials["per_trial"]]
    assert len(set(urls)) == 2 and all(url.endswith("/v1/audio/speech") for url in urls), urls
    (level,) = document["targets"][0]["levels"]
    assert level["num_trials"] == level["gate"]["num_trials"] == 2
    assert [request["trial"] for request in level["requests"]] == [0, 1]
    check_public_level(level)
    # Each trial's mesh was read back as its observer: every first packet broken into stages, no password kept.
    assert all(set(STAGES) <= set(request["first_packet_stages"]) for request in level["requests"]), level["requests"]
    assert level["first_packet_stages"]["num_requests"] == 1, "the median of the trials' one request each"
    assert [url.split("@")[0] for url in document["config"]["events_urls"]] == ["nats://observer:***"]
    for trial in (0, 1):
        log = (logs / f"trial{trial}.log").read_text()
        assert "voxmesh is serving" in log and "voxmesh stopped" in log, "each mesh started and was stopped"


async def test_a_mesh_that_ends_before_serving_is_a_typed_error_with_its_output(tmp_path):
    launcher = MeshLauncher(up_args=("--topology", "no-such-topology"), log_dir=tmp_path, start_timeout_s=120.0)
    with pytest.raises(MeshStartError) as failed:
        async with launcher.running("bad"):
            pytest.fail("a mesh without a topology file cannot serve")
    assert failed.value.code == "mesh_failed" and "no-such-topology" in failed.value.message
    assert "no-such-topology" in (tmp_path / "bad.log").read_text()
