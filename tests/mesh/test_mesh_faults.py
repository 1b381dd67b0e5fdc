"""Stages killed (SIGKILL) or stalled (SIGSTOP) mid-stream under `voxmesh up`, on the tiny CPU model in float32.

Each kill test streams two requests at once, kills a stage once both are playing, and asserts for each request:
complete audio equal, byte for byte, to an undisturbed run of the same requests (fixed seeds; run first, on the same
mesh), one audio frame per chunk (no duplicate, no gap), and exactly one terminal event. A killed decode's requests
migrate to its restarted self, which continues them from their frames in CODES; a killed vocoder's partitions are
claimed by its restarted self, which rebuilds each request's codec state from CODES; a killed gateway loses only its
clients' sockets, and a client that resumes on the restarted gateway gets the rest. A stalled vocoder (alive, silent)
is noticed by the gateway's supervisor, which fails the request with stage `vocoder`. `voxmesh up` restarts a killed
service, as `docker compose` would with the file's restart policy.

The vocoder decodes each chunk alone here (VOXMESH_CODEC_BATCHING=false), so its bytes do not depend on which
requests share a codec call (a conv's last bit can); decode's codes are batch-invariant on the CPU in float32.
Nothing sleeps: every step waits for an event (first audio, `voxmesh up`'s restart line, a service's own log line,
a Migrated event on the bus).
"""

from __future__ import annotations

import asyncio
import os
import signal

import nats
import pytest

from messages import Failed, subjects
from messages.events import Migrated
from tests.support.mesh import run_mesh
from tests.support.mesh_client import (FAULT_BODIES as BODIES, WAIT_S, LiveStream, assert_as_undisturbed, events_of,
                               start_streams, stream_speech, terminal_count, undisturbed_run)
from tests.support.mesh_kills import assert_a_killed_gateway_s_streams_resume_whole



@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    """This module's own `single` mesh: the kills below would disturb other modules' tests."""
    # A killed vocoder's partitions wait for its restarted self (a new process: torch imported, the codec loaded),
    # which on a loaded two-core machine takes longer than the default 5-s grace before the gateway fails them; 15 s
    # is what the Kubernetes manifests give a restart on another node too (docs/scaling.md).
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("fault-mesh"),
                  env={"VOXMESH_CODEC_BATCHING": "false", "VOXMESH_VOCODER_GRACE_S": "15"}) as running:
        yield running


@pytest.fixture(scope="module")
def undisturbed(mesh) -> list[LiveStream]:
    """The same requests streamed together first, with nothing killed."""
    return undisturbed_run(mesh.gateway_url)


async def test_killed_decode_s_restarted_self_migrates_its_requests(mesh, undisturbed):
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    restarted = mesh.expect_restart("decode")
    os.kill(mesh.pids["decode"], signal.SIGKILL)
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    for live in results:
        events = await events_of(mesh.nats_url, live.request_id)
        assert any(isinstance(event, Migrated) for event in events), "killed mid-stream, so it migrated"
    assert await asyncio.to_thread(restarted.wait, 60)


async def test_killed_vocoder_s_restarted_self_completes_its_streams(mesh, undisturbed):
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    restarted = mesh.expect_restart("vocoder")
    os.kill(mesh.pids["vocoder"], signal.SIGKILL)
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    assert await asyncio.to_thread(restarted.wait, 60)


async def test_killed_decode_then_vocoder_one_after_the_other(mesh, undisturbed):
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    nc = await nats.connect(mesh.nats_url)
    try:
        migrated = [await nc.subscribe(subjects.event(live.request_id, Migrated.KIND)) for live in lives]
        decode_back, vocoder_back = mesh.expect_restart("decode"), mesh.expect_restart("vocoder")
        os.kill(mesh.pids["decode"], signal.SIGKILL)
        for subscription in migrated:  # decode's restarted self has taken both requests over
            await subscription.next_msg(timeout=WAIT_S)
        os.kill(mesh.pids["vocoder"], signal.SIGKILL)
        results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    finally:
        await nc.close()
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    assert await asyncio.to_thread(decode_back.wait, 60) and await asyncio.to_thread(vocoder_back.wait, 60)


async def test_killed_gateway_ends_its_streams_once_and_a_resume_on_its_restarted_self_gets_the_rest(
        mesh, undisturbed):
    await assert_a_killed_gateway_s_streams_resume_whole(mesh, undisturbed)


async def test_stalled_vocoder_fails_its_request_with_stage_vocoder(mesh):
    first_audio, started = asyncio.Event(), {}
    task = asyncio.create_task(stream_speech(mesh.gateway_url, BODIES[0], first_audio, started))
    await asyncio.wait_for(first_audio.wait(), WAIT_S)
    vocoder = mesh.pids["vocoder"]
    os.kill(vocoder, signal.SIGSTOP)
    try:
        result = await asyncio.wait_for(task, WAIT_S)
    finally:
        os.kill(vocoder, signal.SIGCONT)
    assert result.end["type"] == "error", result.end
    assert result.end["code"] == "replica_lost"
    events = await events_of(mesh.nats_url, result.request_id)
    terminal = events[-1]
    assert isinstance(terminal, Failed) and terminal.stage == "vocoder" and terminal.code == "replica_lost"
    assert await terminal_count(mesh.nats_url, result.request_id) == 1
