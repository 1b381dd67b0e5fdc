"""A cloned voice in the `1p1d` topology (`voxmesh up --topology 1p1d`, the tiny base checkpoint, UCX over loopback
TCP): the prefill replica does the reference audio's work and hands decode the ready voice prompt with the prompt's
KV, so decode computes no voice prompt, and the codes are those of an offline clone (greedy, both modes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.mesh import run_mesh
from tests.mesh_client import codes_on_bus, replicas_serving, service_stats, stream_speech
from tests.reference_audio_files import audio_file, data_uri

pytestmark = pytest.mark.timeout(600)

REF_TEXT = "This is how I sound."
TEXT = "The prefill replica hears the reference."
FRAMES = 16


@pytest.fixture(scope="module")
def mesh(tiny_base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    with run_mesh(tiny_base_checkpoint, tmp_path_factory.mktemp("1p1d-clone-mesh"), "--topology", "1p1d") as running:
        yield running


def offline_codes(checkpoint: Path, tmp_path: Path, reference: Path, mode: list[str]) -> np.ndarray:
    codes = tmp_path / "codes.npy"
    subprocess.run([sys.executable, "-m", "services.cli", "synth", "--model", str(checkpoint), "--text", TEXT,
                    "--ref-audio", str(reference), *mode, "--greedy", "--max-new-tokens", str(FRAMES),
                    "--output", str(tmp_path / "synth.wav"), "--codes-out", str(codes)], check=True)
    return np.load(codes)


async def stats_of(mesh, service: str) -> dict:
    """The one replica's STATS (every endpoint of a replica reports the replica's; a base checkpoint's decode has two)."""
    endpoints = await service_stats(mesh.nats_url, service)
    assert endpoints and all(data == endpoints[0] for data in endpoints), endpoints
    return endpoints[0]


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_prefill_computes_the_voice_and_decode_speaks_it(mesh, tiny_base_checkpoint, tmp_path, x_vector_only):
    await replicas_serving(mesh.nats_url, "prefill")
    reference = tmp_path / "me.flac"
    reference.write_bytes(audio_file(2.5, 48000, fmt="FLAC", seed=7 + x_vector_only))
    mode = ["--x-vector-only"] if x_vector_only else ["--ref-text", REF_TEXT]
    fields = {"x_vector_only_mode": True} if x_vector_only else {"ref_text": REF_TEXT}
    prefill_before, decode_before = await stats_of(mesh, "voxmesh-prefill"), await stats_of(mesh, "voxmesh-decode")
    result = await stream_speech(mesh.gateway_url, {"input": TEXT, "temperature": 0, "max_new_tokens": FRAMES,
                                                    "ref_audio": data_uri(reference.read_bytes(), "audio/flac")}
                                 | fields)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(mesh.nats_url, result.request_id)
    np.testing.assert_array_equal(codes, offline_codes(tiny_base_checkpoint, tmp_path, reference, mode))
    prefill, decode = await stats_of(mesh, "voxmesh-prefill"), await stats_of(mesh, "voxmesh-decode")
    assert prefill["handed_over"] == prefill_before["handed_over"] + 1, prefill
    assert prefill["voice_prompts_computed"] == prefill_before["voice_prompts_computed"] + 1, prefill
    assert decode["handoffs_fetched"] == decode_before["handoffs_fetched"] + 1, decode
    assert decode["voice_prompts_handed_over"] == decode_before["voice_prompts_handed_over"] + 1, decode
    assert decode["voice_prompts_computed"] == 0, "decode did no reference-audio work"
