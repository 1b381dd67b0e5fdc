"""The `1p1d` topology (compose/1p1d.yml) under `voxmesh up` on the tiny CPU model: prompts prefilled on the prefill
replica, their KV moved by UCX over loopback TCP into decode's pool, give the codes of an offline run (greedy and
seeded, several at once, some prefilled remotely and some by decode); when the KV cannot be had (the prefill replica
killed, or stalled past decode's fetch watchdog, after it handed the request over), decode prefills the prompt
itself and the codes are still those of the offline run; and the preemption contract holds for a request whose
prompt KV came by remote prefill (`fail`: one `preempted` terminal after the audio made; `allow`: a faithful replay).

Decode is held still (SIGSTOP) where a test needs a hand-off to wait on the queue: nothing is timed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import nats
import numpy as np
import pytest

from messages import encode, subjects
from messages.events import Failed, Finished, Preempted
from messages.mtp import PrefillHandoff
from messages.requests import SamplingSpec, SynthesisRequest
from messages.streams import REQUESTS_STREAM
from tests.support.mesh import run_mesh
from tests.support.mesh_client import (WAIT_S, codes_on_bus, events_of, one_replica_stats, replicas_serving,
                               stream_speech, terminal_count)
from tests.support.offline_synthesis import synth_codes
from tests.mesh.test_mesh_preemption import FRAMES as PREEMPTION_FRAMES
from tests.mesh.test_mesh_preemption import SMALL_BLOCKS, SMALL_POOL, TEXTS
from tests.mesh.test_mesh_preemption import body as preemption_body

FRAMES = 16
BODIES = (
    {"input": "The prefill replica runs this prompt first.", "voice": "vivian", "temperature": 0,
     "max_new_tokens": FRAMES},
    {"input": "A second prompt, greedy too, beside it.", "voice": "ryan", "temperature": 0, "max_new_tokens": FRAMES},
    {"input": "A third prompt is sampled with a seed.", "voice": "eric", "seed": 99, "max_new_tokens": FRAMES},
)


def oracle(checkpoint, body: dict, ignore_eos: bool = False) -> np.ndarray:
    return synth_codes(checkpoint, body["input"], body["voice"], seed=body.get("seed"),
                       frames=body["max_new_tokens"], ignore_eos=ignore_eos)


async def handoffs_queued(mesh, count: int) -> None:
    """Wait until `count` prefilled requests wait on decode's queue (decode is stopped meanwhile)."""
    nc = await nats.connect(mesh.nats_url)
    try:
        js = nc.jetstream()
        subject = subjects.handoff_queue("tiny")
        async with asyncio.timeout(WAIT_S):
            sub = await nc.subscribe(subject)  # wakes the wait; the stream's count is the truth
            while True:
                info = await js.stream_info(REQUESTS_STREAM, subjects_filter=subject)
                if (info.state.subjects or {}).get(subject, 0) >= count:
                    return
                await sub.next_msg(timeout=WAIT_S)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("1p1d-mesh"), "--topology", "1p1d",
                  env={"VOXMESH_HANDOFF_TIMEOUT_S": "3"}) as running:
        yield running


async def test_prefilled_remotely_or_not_the_codes_are_the_offline_ones(mesh, tiny_checkpoint):
    await replicas_serving(mesh.nats_url, "prefill")
    results = await asyncio.gather(*[stream_speech(mesh.gateway_url, body) for body in BODIES])
    for body, result in zip(BODIES, results):
        assert result.end["type"] == "audio.done", result.end
        codes, _ = await codes_on_bus(mesh.nats_url, result.request_id)
        np.testing.assert_array_equal(codes, oracle(tiny_checkpoint, body), err_msg=body["input"])
    prefill = await one_replica_stats(mesh.nats_url, "voxmesh-prefill")
    decode = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    assert prefill["handed_over"] >= 1, prefill
    assert decode["handoffs_fetched"] >= 1, decode


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["prefill-killed", "prefill-stalled"])
async def test_a_handoff_whose_kv_is_lost_is_prefilled_by_decode(mesh, fault, tiny_checkpoint):
    body = {"input": "Its prefill replica goes away after the hand-off.", "voice": "ryan", "seed": 5,
            "max_new_tokens": FRAMES}
    serving = await replicas_serving(mesh.nats_url, "prefill")
    before = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    prefill_restarted = mesh.expect_restart("prefill")
    os.kill(mesh.pids["decode"], signal.SIGSTOP)
    try:
        stream = asyncio.create_task(stream_speech(mesh.gateway_url, body))
        await handoffs_queued(mesh, 1)
        prefill_pid = mesh.pids["prefill"]
        os.kill(prefill_pid, fault)
    finally:
        os.kill(mesh.pids["decode"], signal.SIGCONT)
    try:
        result = await stream
    finally:
        if fault == signal.SIGSTOP:
            os.kill(prefill_pid, signal.SIGCONT)
    assert result.end["type"] == "audio.done", result.end
    codes, _ = await codes_on_bus(mesh.nats_url, result.request_id)
    np.testing.assert_array_equal(codes, oracle(tiny_checkpoint, body))
    after = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    assert after["handoffs_fetch_failed"] == before["handoffs_fetch_failed"] + 1, after
    assert await terminal_count(mesh.nats_url, result.request_id) == 1
    if fault == signal.SIGKILL:
        assert await asyncio.to_thread(prefill_restarted.wait, WAIT_S), "voxmesh up restarts the killed prefill"
        # Its successor serving before the next test: the killed one's lease outlives it a while, and a route that
        # looked between its expiry and the successor's first lease would send the next test's request to decode.
        await replicas_serving(mesh.nats_url, "prefill", excluding=serving)


async def test_a_handoff_from_another_checkpoint_is_not_used_at_all(mesh, tiny_checkpoint):
    """A hand-off whose fingerprint names another checkpoint (its KV and first frame are another model's): decode
    takes neither, prefills the prompt itself, and the codes are this checkpoint's from frame 0."""
    text = "Made by another checkpoint, spoken by this one."
    request = SynthesisRequest(id="foreign-handoff", model="tiny", text=text, speaker="ryan",
                               sampling=SamplingSpec(temperature=0.0), max_new_tokens=FRAMES, created_at=time.time())
    oracle_codes = synth_codes(tiny_checkpoint, text, "ryan", frames=FRAMES)
    foreign_first = [(code + 1) % 1024 for code in oracle_codes[0].tolist()]  # not frame 0: were it used, it shows
    handoff = PrefillHandoff(request=request, fingerprint="another-checkpoint", prefill_replica="prefill-elsewhere",
                             prompt_tokens=12, transfer=b"never fetched", first_frame=foreign_first)
    before = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    nc = await nats.connect(mesh.nats_url)
    try:
        await nc.jetstream().publish(subjects.handoff_queue("tiny"), encode(handoff), stream=REQUESTS_STREAM,
                                     headers={"Nats-Msg-Id": "foreign-handoff:handoff:1"})
    finally:
        await nc.close()
    codes, end = await codes_on_bus(mesh.nats_url, request.id)
    np.testing.assert_array_equal(codes, oracle_codes)
    after = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
    assert after["handoffs_fetch_failed"] == before["handoffs_fetch_failed"] + 1, after
    assert after["handoffs_fetched"] == before["handoffs_fetched"], "nothing was fetched from the other checkpoint"
    events = await events_of(mesh.nats_url, request.id)  # up to its terminal, which the vocoder sends after the codes
    assert isinstance(events[-1], Finished), events
    assert await terminal_count(mesh.nats_url, request.id) == 1


@pytest.mark.parametrize("mode", ["fail", "allow"])
async def test_the_preemption_contract_holds_for_remotely_prefilled_requests(mode, tiny_checkpoint, tmp_path):
    """Both requests prefilled remotely (decode held still until both hand-offs wait on its queue), then a pool too
    small for both to the end: the newer is preempted. `fail`: the audio made, then one `preempted` error; `allow`:
    replayed here (its KV came from elsewhere; the replay computes it locally) and equal to an undisturbed run."""
    with run_mesh(tiny_checkpoint, tmp_path / "state", "--topology", "1p1d", *SMALL_POOL,
                  "--recompute-preemption", mode, env=SMALL_BLOCKS) as mesh:
        await replicas_serving(mesh.nats_url, "prefill")
        os.kill(mesh.pids["decode"], signal.SIGSTOP)
        try:
            streams = [asyncio.create_task(stream_speech(mesh.gateway_url, preemption_body(text))) for text in TEXTS]
            await handoffs_queued(mesh, len(TEXTS))
        finally:
            os.kill(mesh.pids["decode"], signal.SIGCONT)
        results = await asyncio.gather(*streams)
        decode = await one_replica_stats(mesh.nats_url, "voxmesh-decode")
        codes = [(await codes_on_bus(mesh.nats_url, r.request_id))[0] for r in results]
        events = [await events_of(mesh.nats_url, r.request_id) for r in results]
        terminals = [await terminal_count(mesh.nats_url, r.request_id) for r in results]
    assert decode["handoffs_fetched"] == 2 and decode["preemptions"] >= 1, decode
    preempted = [any(isinstance(e, Preempted) for e in request_events) for request_events in events]
    assert sorted(preempted) == [False, True], events
    victim = preempted.index(True)
    oracle_codes = [synth_codes(tiny_checkpoint, text, "ryan", frames=PREEMPTION_FRAMES, ignore_eos=True)
                    for text in TEXTS]
    assert terminals == [1, 1]
    np.testing.assert_array_equal(codes[1 - victim], oracle_codes[1 - victim])
    if mode == "fail":
        assert results[victim].end["code"] == "preempted", results[victim].end
        assert 0 < codes[victim].shape[0] < PREEMPTION_FRAMES
        np.testing.assert_array_equal(codes[victim], oracle_codes[victim][: codes[victim].shape[0]])
        assert isinstance(events[victim][-1], Failed) and events[victim][-1].code == "preempted"
    else:
        assert results[victim].end["type"] == "audio.done", results[victim].end
        np.testing.assert_array_equal(codes[victim], oracle_codes[victim])
        assert isinstance(events[victim][-1], Finished)
