"""The preemption contract as clients see it, through the whole mesh, with a KV pool too small for the load.

Pool: 16 blocks of 4 tokens. Each request (a ~20-token prompt, 24 fixed-length frames) fits alone, and two fit
at prefill, but not both to the end: the newer one is preempted part-way. Decode is held still until both are
queued, so they always meet in the engine. In `fail` mode its client gets the
audio made so far and then one `preempted` error; in `allow` mode it is replayed faithfully and both clients get
exactly the audio of an unconstrained run.
"""

from __future__ import annotations

import asyncio
import os
import signal

import nats
import numpy as np
import pytest
import torch

from messages import Accepted, AudioChunk, Failed, Finished, Preempted, subjects
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from services.model.codec.loader import load_codec_decoder
from tests.support.mesh import run_mesh
from tests.support.mesh_client import StreamResult, codes_on_bus, events_of, service_stats, stream_speech, terminal_count
from tests.support.offline_synthesis import synth_codes

FRAMES = 24
SMALL_POOL = ("--kv-cache-blocks", "16")
SMALL_BLOCKS = {"VOXMESH_BLOCK_SIZE": "4"}
TEXTS = ("speak and the voice", "voice and hello")


def offline_pcm(checkpoint, codes: np.ndarray) -> np.ndarray:
    """The s16 samples an undisturbed run of these codes gives (the vocoder's conversion)."""
    decoder = load_codec_decoder(checkpoint / "speech_tokenizer", device="cpu", dtype=torch.float32)
    samples = decoder.decode(torch.from_numpy(np.array(codes))).numpy()  # a writable copy: the codes come from a bus buffer
    chunk = AudioChunk.from_float(request_id="x", seq=0, first_sample=0, sample_rate=SAMPLE_RATE, samples=samples)
    return chunk.samples().astype(np.int32)


def body(text: str) -> dict:
    return {"input": text, "voice": "ryan", "temperature": 0, "max_new_tokens": FRAMES, "ignore_eos": True}


async def both_at_once(mesh) -> tuple[StreamResult, StreamResult]:
    """Stream both requests so that decode sees them together: decode is paused (SIGSTOP) until the queue holds
    both (their `accepted` events), so neither can finish before the other starts, however slow the machine."""
    nc = await nats.connect(mesh.nats_url)
    try:
        accepted = await nc.subscribe(subjects.events_of_kind(Accepted.KIND))
        os.kill(mesh.pids["decode"], signal.SIGSTOP)
        try:
            streams = [asyncio.create_task(stream_speech(mesh.gateway_url, body(text))) for text in TEXTS]
            for _ in TEXTS:
                await accepted.next_msg(timeout=60)
        finally:
            os.kill(mesh.pids["decode"], signal.SIGCONT)
        return tuple(await asyncio.gather(*streams))
    finally:
        await nc.close()


@pytest.mark.parametrize("mode", ["fail", "allow"])
async def test_small_pool_through_the_mesh(mode, tiny_checkpoint, tmp_path):
    with run_mesh(tiny_checkpoint, tmp_path / "state", *SMALL_POOL, "--recompute-preemption", mode,
                  env=SMALL_BLOCKS) as mesh:
        results = await both_at_once(mesh)
        stats = await service_stats(mesh.nats_url, "voxmesh-decode")
        codes = [(await codes_on_bus(mesh.nats_url, r.request_id))[0] for r in results]
        events = [await events_of(mesh.nats_url, r.request_id) for r in results]
        terminals = [await terminal_count(mesh.nats_url, r.request_id) for r in results]
    assert max(s.get("preemptions", 0) for s in stats) >= 1, stats  # the pool really was too small
    # Which of the two the engine admitted last (and so preempted) is the engine's call: find it by its events.
    preempted = [any(isinstance(e, Preempted) for e in request_events) for request_events in events]
    assert sorted(preempted) == [False, True], events
    victim_at = preempted.index(True)
    survivor_at = 1 - victim_at
    survivor, victim = results[survivor_at], results[victim_at]
    survivor_codes, victim_codes, victim_events = codes[survivor_at], codes[victim_at], events[victim_at]
    oracle = [synth_codes(tiny_checkpoint, text, "ryan", frames=FRAMES, ignore_eos=True) for text in TEXTS]
    assert terminals == [1, 1]
    assert survivor.end["type"] == "audio.done", survivor.end
    np.testing.assert_array_equal(survivor_codes, oracle[survivor_at])
    if mode == "fail":
        assert victim.end["type"] == "error" and victim.end["code"] == "preempted", victim.end
        assert "truncated" in victim.end["message"]
        assert 0 < victim_codes.shape[0] < FRAMES
        np.testing.assert_array_equal(victim_codes, oracle[victim_at][: victim_codes.shape[0]])
        assert len(victim.pcm) == 2 * SAMPLES_PER_FRAME * victim_codes.shape[0], "the audio made before the preemption"
        assert isinstance(victim_events[-1], Failed) and victim_events[-1].code == "preempted"
    else:
        assert victim.end["type"] == "audio.done", victim.end
        np.testing.assert_array_equal(victim_codes, oracle[victim_at])
        # The codec may batch the two streams' chunks (its float rounding differs by batch size): 2 LSB of slack.
        expected = offline_pcm(tiny_checkpoint, oracle[victim_at])
        heard = np.frombuffer(victim.pcm, dtype="<i2").astype(np.int32)
        assert heard.shape == expected.shape and np.abs(heard - expected).max() <= 2
        kinds = [type(e).__name__ for e in victim_events]
        assert kinds.index("Preempted") < kinds.index("Resumed")
        assert isinstance(victim_events[-1], Finished)
