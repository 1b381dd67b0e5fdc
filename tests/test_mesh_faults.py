"""Stages die or stall mid-request: the request ends with exactly one terminal event that says what happened.

A killed decode replica's requests migrate to its restarted self, which continues them from their frames in CODES. A stalled vocoder (SIGSTOP: alive, silent) is
noticed by the gateway's supervisor, which fails the request with stage `vocoder`. A killed gateway
loses only its clients: decode and vocoder finish the request, which still gets exactly one terminal.
`voxmesh up` restarts a killed service, as `docker compose` would with the file's restart policy.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import websockets

from messages import Failed, Finished
from messages.events import Migrated
from tests.mesh_client import events_of, stream_speech, terminal_count

LONG_REQUEST = {"input": "A long sentence that keeps the stages busy for a while.", "voice": "vivian",
                "max_new_tokens": 200, "ignore_eos": True, "seed": 3}


async def start_streaming(mesh) -> tuple[asyncio.Task, dict]:
    """A long request, streaming audio by the time this returns; returns the task and its audio.start event."""
    first_audio, started = asyncio.Event(), {}
    task = asyncio.create_task(stream_speech(mesh.gateway_url, LONG_REQUEST, first_audio, started))
    await asyncio.wait_for(first_audio.wait(), 120)
    return task, started


async def test_killed_decode_s_restarted_self_migrates_its_request(mesh):
    task, _ = await start_streaming(mesh)
    restarted = mesh.expect_restart("decode")
    os.kill(mesh.pids["decode"], signal.SIGKILL)
    result = await asyncio.wait_for(task, 120)
    assert result.end["type"] == "audio.done", result.end
    assert result.end["frames"] == LONG_REQUEST["max_new_tokens"]
    events = await events_of(mesh.nats_url, result.request_id)
    assert any(isinstance(event, Migrated) for event in events), [type(event).__name__ for event in events]
    assert isinstance(events[-1], Finished)
    assert await terminal_count(mesh.nats_url, result.request_id) == 1
    assert await asyncio.to_thread(restarted.wait, 60)


async def test_stalled_vocoder_fails_its_request_with_stage_vocoder(mesh):
    task, _ = await start_streaming(mesh)
    vocoder = mesh.pids["vocoder"]
    os.kill(vocoder, signal.SIGSTOP)
    try:
        result = await asyncio.wait_for(task, 120)
    finally:
        os.kill(vocoder, signal.SIGCONT)
    assert result.end["type"] == "error", result.end
    assert result.end["code"] == "replica_lost"
    events = await events_of(mesh.nats_url, result.request_id)
    terminal = events[-1]
    assert isinstance(terminal, Failed) and terminal.stage == "vocoder" and terminal.code == "replica_lost"
    assert await terminal_count(mesh.nats_url, result.request_id) == 1


async def test_killed_gateway_leaves_the_request_to_finish_with_one_terminal(mesh):
    task, started = await start_streaming(mesh)
    restarted = mesh.expect_restart("gateway")
    os.kill(mesh.pids["gateway"], signal.SIGKILL)
    with pytest.raises(websockets.ConnectionClosed):  # the client's socket dies with its gateway
        await asyncio.wait_for(task, 60)
    events = await events_of(mesh.nats_url, started["request_id"])
    assert isinstance(events[-1], Finished), events[-1]
    assert events[-1].frames == LONG_REQUEST["max_new_tokens"]
    assert await terminal_count(mesh.nats_url, started["request_id"]) == 1
    assert await asyncio.to_thread(restarted.wait, 60)
