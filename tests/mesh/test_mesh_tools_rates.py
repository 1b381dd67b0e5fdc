"""The tools against a real tiny mesh at another rate and format than the model's: `voxmesh say --sample-rate` writes
the rate it asked for, and `voxmesh bench` measures mp3 and aac answers at 16 kHz as it measures PCM (every request
complete, its audio as long as the frames it asked for)."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from messages.audio_format import FRAMES_PER_SECOND
from tests.support.mesh import Mesh, run_mesh

FRAMES = 24
CLI_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory) -> Iterator[Mesh]:
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("mesh-state")) as running:
        yield running


def voxmesh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *argv], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)


def test_say_writes_the_rate_it_asked_for_naming_no_model(mesh, tmp_path):
    out = tmp_path / "said.wav"
    said = voxmesh("say", "Hello there.", "-o", str(out), "--url", mesh.gateway_url, "--sample-rate", "16000")
    assert said.returncode == 0, said.stderr
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 16000 and wav.getnframes() > 0


@pytest.mark.parametrize("response_format", ["mp3", "aac"])
def test_bench_measures_a_compressed_answer_at_16_khz(mesh, tmp_path, response_format):
    out = tmp_path / "bench.json"
    prompts = tmp_path / "prompts.tsv"
    prompts.write_text("p1\tThe harbour lights came on one by one.\np2\tSeven owls sat on the old fence.\n")
    done = voxmesh("bench", "--url", mesh.gateway_url, "--transport", "http", "--response-format", response_format,
                   "--sample-rate", "16000", "--mode", "open", "--rates", "2", "--requests", "3",
                   "--fixed-frames", str(FRAMES), "--prompts", str(prompts), "--no-plot", "--out", str(out))
    assert done.returncode == 0, done.stderr
    (target,) = json.loads(out.read_text())["targets"]
    assert (target["labels"]["response_format"], target["labels"]["sample_rate"]) == (response_format, 16000)
    (level,) = target["levels"]
    assert level["summary"]["num_completed"] == 3, level["summary"]["errors"]
    expected_s = FRAMES / FRAMES_PER_SECOND
    for request in level["requests"]:
        # a codec's priming and padding add a few tens of ms; the resampler's tail a few
        assert expected_s - 0.01 <= request["audio_s"] <= expected_s + 0.15, request
