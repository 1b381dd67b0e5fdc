"""A cloned voice in the `1p1d` topology (`voxmesh up --topology 1p1d`, the tiny base checkpoint, UCX over loopback
TCP): the prefill replica does the reference audio's work and hands decode the ready voice prompt with the prompt's
KV, so decode computes no voice prompt, and the codes are those of an offline clone (greedy, both modes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.mesh import run_mesh
from tests.support.mesh_client import codes_on_bus, one_replica_stats, replicas_serving, stream_speech
from tests.support.reference_audio_files import audio_file, data_uri
from tests.mesh.test_mesh_e2e import clone_codes

pytestmark = pytest.mark.timeout(600)

REF_TEXT = "This is how I sound."
TEXT = "The prefill replica hears the reference."
FRAMES = 16


@pytest.fixture(scope="module")
def mesh(tiny_base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    with run_mesh(tiny_base_checkpoint, tmp_path_factory.mktemp("1p1d-clone-mesh"), "--topology", "1p1d") as running:
        yield running


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_prefill_computes_the_voice_and_decode_speaks_it(mesh, tiny_base_checkpoint, tmp_path, x_vector_only):
    await replicas_serving(mesh.nats_url, "prefill")
    reference = tmp_path / "me.flac"
    reference.write_bytes(audio_file(2.5, 48000, fmt="FLAC", seed=7 + x_vector_only))
    mode = ["--x-vector-only"] if x_vector_only else ["--ref-text", REF_TEXT]
    fields = {"x_vector_only_mode": True} if x_vector_only else {"ref_text": REF_TEXT}
    prefill_before = await one_replica_stats(mesh.nats_url, "voxmesh-prefill")
    decode_before = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    result = await stream_speech(mesh.gateway_url, {"input": TEXT, "temperature": 0, "max_new_tokens": FRAMES,
                                                    "ref_audio": data_uri(reference.read_bytes(), "audio/flac")}
                                 | fields)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(mesh.nats_url, result.request_id)
    np.testing.assert_array_equal(codes, clone_codes(tiny_base_checkpoint, tmp_path, TEXT, reference, mode, FRAMES))
    prefill = await one_replica_stats(mesh.nats_url, "voxmesh-prefill")
    decode = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    assert prefill["handed_over"] == prefill_before["handed_over"] + 1, prefill
    assert prefill["voice_prompts_computed"] == prefill_before["voice_prompts_computed"] + 1, prefill
    assert decode["handoffs_fetched"] == decode_before["handoffs_fetched"] + 1, decode
    assert decode["voice_prompts_handed_over"] == decode_before["voice_prompts_handed_over"] + 1, decode
    assert decode["voice_prompts_computed"] == 0, "decode did no reference-audio work"
    # Where the prompt's time went is timed where the work ran: one read of the reference, one computation.
    for part in ("audio_read", "compute"):
        assert (prefill["voice_prompt_seconds"][part]["count"]
                == prefill_before["voice_prompt_seconds"][part]["count"] + 1), prefill
        assert prefill["voice_prompt_seconds"][part]["p95_ms"] > 0, prefill
        assert decode["voice_prompt_seconds"][part]["count"] == 0, decode
