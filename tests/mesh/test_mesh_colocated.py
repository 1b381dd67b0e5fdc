"""The `colocated` topology as a user runs it: `voxmesh up --topology colocated` starts the gateway and one process
holding decode and the vocoder. Same bus contract as `single`: the codes equal offline synthesis, the audio has every
frame, each request ends with one terminal event, and both halves answer as their own `$SRV` services (the vocoder's
replica name carries the decode-vocoder process's pid)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from messages.audio_format import SAMPLES_PER_FRAME
from tests.support.mesh import run_mesh
from tests.support.mesh_client import codes_on_bus, service_stats, stream_speech, terminal_count
from tests.mesh.test_mesh_e2e import LONG_FRAMES, TEXTS, greedy_body
from tests.support.offline_synthesis import synth_codes


@pytest.fixture(scope="module")
def colocated(tiny_checkpoint, tmp_path_factory):
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("colocated-state"), "--topology", "colocated") as mesh:
        yield mesh


async def test_colocated_mesh_streams_the_offline_codes_with_one_terminal_each(colocated, tiny_checkpoint):
    assert set(colocated.pids) == {"gateway", "decode-vocoder"}, colocated.pids
    tasks = []
    for text in TEXTS[:2]:
        first_audio = asyncio.Event()  # the second request starts once the first is streaming: they share steps
        tasks.append(asyncio.create_task(stream_speech(colocated.gateway_url, greedy_body(text), first_audio)))
        await asyncio.wait_for(first_audio.wait(), 120)
    for text, result in zip(TEXTS, await asyncio.gather(*tasks)):
        assert result.end["type"] == "audio.done", result.end
        codes, end = await codes_on_bus(colocated.nats_url, result.request_id)
        np.testing.assert_array_equal(codes, synth_codes(tiny_checkpoint, text, frames=LONG_FRAMES,
                                                         ignore_eos=True))
        assert len(result.pcm) == 2 * SAMPLES_PER_FRAME * LONG_FRAMES and result.end["chunk_count"] == end.seq
        assert await terminal_count(colocated.nats_url, result.request_id) == 1
    decode = (await service_stats(colocated.nats_url, "voxmesh-decode"))[0]
    vocoder = (await service_stats(colocated.nats_url, "voxmesh-vocoder"))[0]
    assert decode["requests_finished"] >= 2 and vocoder["audio_chunks"] >= 2 * end.seq
    # The vocoder half runs in the decode-vocoder process: its replica name carries that process's pid.
    assert f"-{colocated.pids['decode-vocoder']}-" in vocoder["replica"], vocoder["replica"]


def test_the_vocoder_half_shares_decodes_common_settings_and_reads_its_own_environment(monkeypatch):
    from services.colocated.service import vocoder_settings
    from services.decode.settings import DecodeSettings

    monkeypatch.setenv("VOXMESH_MAX_STREAMS", "9")
    monkeypatch.setenv("VOXMESH_DEVICE", "cuda:3")  # decode's own value below must win for a shared setting
    decode = DecodeSettings(nats_url="nats://127.0.0.1:4999", model_dir="/m", device="cpu", replica="pair-a")
    vocoder = vocoder_settings(decode)
    assert (vocoder.nats_url, vocoder.model_dir, vocoder.device) == ("nats://127.0.0.1:4999", "/m", "cpu")
    assert vocoder.max_streams == 9 and vocoder.replica == "pair-a-vocoder"
    assert vocoder_settings(DecodeSettings()).replica is None  # each half names itself
