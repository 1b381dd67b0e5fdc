"""`voxmesh up --model ORG/NAME`: a hub model served by the real mesh, from a hub cache laid out as huggingface_hub
lays it out (offline, a revision pinned) and downloaded by `up` from a stand-in hub on loopback; served under its id.
No test here reaches the network: HF_HOME is the test's, HF_ENDPOINT the stand-in's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.support.http_client import read_wav
from tests.support.hub_models import COMMIT_A, COMMIT_B, HUB_ID, cache_snapshot, checkpoint_files
from tests.support.mesh import REPO, free_port, run_mesh
from tests.support.stand_in_hub import HubRepo, StandInHub

pytestmark = pytest.mark.timeout(600)

FRAMES = 4


async def models_and_speech(gateway_url: str, model: str) -> tuple[list[str], bytes]:
    """The ids /v1/models lists, and the PCM of one short seeded request asking for `model`."""
    body = {"model": model, "input": "From the hub.", "voice": "ryan", "response_format": "wav", "seed": 3,
            "max_new_tokens": FRAMES}
    async with httpx.AsyncClient(timeout=120) as client:
        listed = (await client.get(f"{gateway_url}/v1/models")).json()["data"]
        answer = await client.post(f"{gateway_url}/v1/audio/speech", json=body)
    assert answer.status_code == 200, answer.text
    rate, _, _, frames = read_wav(answer.content)
    assert rate == SAMPLE_RATE and len(frames) > 0 and len(frames) % (SAMPLES_PER_FRAME * 2) == 0
    assert np.abs(np.frombuffer(frames, "<i2")).max() > 0
    return [model["id"] for model in listed], frames


def hub_environment(hf_home: Path, **extra: str) -> dict[str, str]:
    return {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


async def test_a_hub_id_in_an_offline_cache_serves_audio_at_the_pinned_revision(tiny_checkpoint, tmp_path):
    hf_home = tmp_path / "hf"
    cache_snapshot(hf_home / "hub", HUB_ID, COMMIT_A, tiny_checkpoint, refs=("main",))
    cache_snapshot(hf_home / "hub", HUB_ID, COMMIT_B, tiny_checkpoint, refs=("v2",))
    env = hub_environment(hf_home, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    with run_mesh(None, tmp_path / "state", "--model", HUB_ID, "--revision", "v2", env=env) as mesh:
        serving = mesh.wait_for_line("voxmesh is serving", 0)
        assert f"hub {HUB_ID} at commit {COMMIT_B}" in serving, serving
        listed, frames = await models_and_speech(mesh.gateway_url, HUB_ID)
        assert listed == [HUB_ID]  # served under its id, no --model-name given
        _, by_slug = await models_and_speech(mesh.gateway_url, "voxmesh-tests-tiny-tts")  # the subject token works
        assert by_slug == frames
    for service in ("gateway", "decode", "vocoder"):  # each found the same snapshot in the cache by itself
        assert any(f"{service} serves model '{HUB_ID}': hub {HUB_ID} at commit {COMMIT_B}" in line
                   for line in mesh.log), service


async def test_up_downloads_a_missing_hub_model_then_serves_it(tiny_checkpoint, tmp_path):
    hf_home = tmp_path / "hf"
    with StandInHub({HUB_ID: HubRepo(commits={COMMIT_A: tiny_checkpoint}, refs={"main": COMMIT_A})}) as hub:
        env = hub_environment(hf_home, HF_ENDPOINT=hub.url)
        with run_mesh(None, tmp_path / "state", "--model", HUB_ID, env=env) as mesh:
            assert sorted(hub.files_sent()) == sorted(f"/{HUB_ID}/resolve/{COMMIT_A}/{name}"
                                                      for name in checkpoint_files(tiny_checkpoint))
            listed, _ = await models_and_speech(mesh.gateway_url, HUB_ID)
            assert listed == [HUB_ID]
    assert any(f"downloading {HUB_ID} (revision main) from {hub.url}" in line for line in mesh.log)
    snapshot = hf_home / "hub" / "models--voxmesh-tests--tiny-tts" / "snapshots" / COMMIT_A
    assert checkpoint_files(snapshot) == checkpoint_files(tiny_checkpoint)


def test_up_refuses_a_hub_model_missing_offline_naming_the_id_and_the_cache(tmp_path):
    env = dict(os.environ, **hub_environment(tmp_path / "hf", HF_HUB_OFFLINE="1"))
    done = subprocess.run([sys.executable, "-m", "services.cli", "up", "--model", "voxmesh-tests/absent", "--port",
                           str(free_port()), "--state-dir", str(tmp_path / "state")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "voxmesh-tests/absent" in done.stderr and "HF_HUB_OFFLINE" in done.stderr
    assert str(tmp_path / "hf" / "hub" / "models--voxmesh-tests--absent") in done.stderr
    assert "voxmesh is serving" not in done.stdout
