"""The `replicas` topology (compose/replicas.yml: two decode and two vocoder replicas) under `voxmesh up`, on the tiny
CPU model: requests spread over the decode replicas, and the CODES partitions over the vocoder replicas. When the
decode replica serving a request is killed (SIGKILL), or stalls (SIGSTOP) long enough to be judged dead, the other
replica (or the killed one's restarted self) takes the request over and continues it from its frames in CODES; a
stalled replica that comes back is fenced out at its next append and stands down. When the vocoder serving a
request's partition is killed, the other vocoder (or the killed one's restarted self) claims the partition and
rebuilds the request's codec state from CODES. A killed gateway loses only its clients' sockets; a resume on its
restarted self gets the rest. Each request's audio equals an undisturbed run of the same requests byte for byte, with
one frame per chunk and one terminal event.
"""

from __future__ import annotations

import asyncio
import os
import signal

import nats
import pytest

from messages import subjects
from messages.events import Migrated
from services.bus.claims import read_owner, read_partition
from services.bus.provision import open_bucket
from services.runtime.lifecycle import micro_name
from tests.support.mesh import run_mesh
from tests.support.mesh_client import (FAULT_BODIES as BODIES, NUM_PARTITIONS, WAIT_S, LiveStream, assert_as_undisturbed,
                               events_of, replica_stats, settled_replica_stats, start_streams, terminal_count,
                               undisturbed_run)
from tests.support.mesh_kills import assert_a_killed_gateway_s_streams_resume_whole

DECODES = ("decode-0", "decode-1")
VOCODERS = ("vocoder-0", "vocoder-1")


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    # Placed as on a two-GPU host (the CPU ignores it; the processes' environments show it).
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("replicas-mesh"), "--topology", "replicas",
                  "--gpus", "decode=0,1", "--gpus", "vocoder=1", env={"VOXMESH_CODEC_BATCHING": "false"}) as running:
        yield running


def test_each_replica_sees_the_gpu_it_was_placed_on(mesh):
    def visible(name: str) -> str | None:
        with open(f"/proc/{mesh.pids[name]}/environ", "rb") as environ:
            variables = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
        value = variables.get(b"CUDA_VISIBLE_DEVICES")
        return None if value is None else value.decode()

    assert [visible(name) for name in (*DECODES, *VOCODERS)] == ["0", "1", "1", "1"]
    assert visible("gateway") == os.environ.get("CUDA_VISIBLE_DEVICES")  # not placed: inherits `up`'s


@pytest.fixture(scope="module")
def undisturbed(mesh) -> list[LiveStream]:
    """The same requests streamed together first, with nothing killed."""
    return undisturbed_run(mesh.gateway_url)


def process_of(mesh, replica: str, names: tuple[str, ...]) -> str:
    """The `voxmesh up` name (decode-0, vocoder-1...) of the process whose replica name is `replica`."""
    return next(name for name in names if f"-{mesh.pids[name]}-" in replica)


async def owners(mesh, lives: list[LiveStream]) -> dict[str, str]:
    """Request id -> the `voxmesh up` name (decode-0 / decode-1) of the decode process that owns it now."""
    nc = await nats.connect(mesh.nats_url)
    try:
        kv = await open_bucket(nc.jetstream())
        found = {}
        for live in lives:
            replica = (await read_owner(kv, live.request_id)).record.replica
            found[live.request_id] = process_of(mesh, replica, DECODES)
        return found
    finally:
        await nc.close()


async def vocoder_of(mesh, live: LiveStream) -> str:
    """The `voxmesh up` name (vocoder-0 / vocoder-1) of the vocoder serving the request's partition now."""
    nc = await nats.connect(mesh.nats_url)
    try:
        kv = await open_bucket(nc.jetstream())
        claim = await read_partition(kv, subjects.partition_for(live.request_id, NUM_PARTITIONS))
        return process_of(mesh, claim.record.replica, VOCODERS)
    finally:
        await nc.close()


async def migrated(mesh, request_ids: list[str]):
    """A subscription per request to its Migrated event (open it before the fault)."""
    nc = await nats.connect(mesh.nats_url)
    return nc, [await nc.subscribe(subjects.event(request_id, Migrated.KIND)) for request_id in request_ids]


async def test_the_plan_runs_two_decode_and_two_vocoder_replicas(mesh):
    assert {"decode-0", "decode-1", "vocoder-0", "vocoder-1"} <= set(mesh.pids)


def each_serves_its_share(stats: dict[str, dict]) -> bool:
    """Every partition served, each vocoder serving its share: no hand-off under way."""
    served = sorted(partition for data in stats.values() for partition in data["partitions"])
    shares = [len(data["partitions"]) for data in stats.values()]
    return served == list(range(NUM_PARTITIONS)) and shares == [NUM_PARTITIONS // len(VOCODERS)] * len(VOCODERS)


async def vocoders_settled(mesh) -> dict[str, dict]:
    """The vocoders' STATS once both are up and each serves its share (after a restart, once the hand-offs ended)."""
    return await settled_replica_stats(mesh.nats_url, micro_name("vocoder"), len(VOCODERS), each_serves_its_share)


async def test_both_vocoder_replicas_serve_a_share_of_the_partitions(mesh):
    stats = await vocoders_settled(mesh)
    assert len(stats) == len(VOCODERS) and all(data["partitions"] for data in stats.values()), stats


async def test_killed_decode_replica_s_requests_are_taken_over(mesh, undisturbed):
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    owned = await owners(mesh, lives)
    victim = owned[lives[0].request_id]
    restarted = mesh.expect_restart(victim)
    os.kill(mesh.pids[victim], signal.SIGKILL)
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    for live in results:
        events = await events_of(mesh.nats_url, live.request_id)
        was_on_victim = owned[live.request_id] == victim
        assert any(isinstance(event, Migrated) for event in events) is was_on_victim
    assert await asyncio.to_thread(restarted.wait, 60)


async def test_a_stalled_decode_replica_is_taken_over_and_stands_down_when_it_comes_back(mesh, undisturbed):
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    owned = await owners(mesh, lives)
    victim = owned[lives[0].request_id]
    moved = [live.request_id for live in lives if owned[live.request_id] == victim]
    nc, subscriptions = await migrated(mesh, moved)
    since = len(mesh.log)
    os.kill(mesh.pids[victim], signal.SIGSTOP)  # alive but silent: its lease lapses, its requests are taken over
    try:
        for subscription in subscriptions:
            await subscription.next_msg(timeout=WAIT_S)
    finally:
        os.kill(mesh.pids[victim], signal.SIGCONT)
        await nc.close()
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    for request_id in moved:  # the stale replica's next append is refused by the server: it stands down
        await asyncio.to_thread(mesh.wait_for_line, rf"request {request_id}: .*fenced out", since, WAIT_S)
    stats = await replica_stats(mesh.nats_url, micro_name("decode"), len(DECODES))
    victim_stats = next(data for replica, data in stats.items() if f"-{mesh.pids[victim]}-" in replica)
    assert victim_stats["requests_stood_down"] >= len(moved)
    for live in results:
        assert await terminal_count(mesh.nats_url, live.request_id) == 1


async def test_killed_vocoder_replica_s_streams_complete_on_the_other_or_its_restarted_self(mesh, undisturbed):
    await vocoders_settled(mesh)
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    victim = await vocoder_of(mesh, lives[0])
    restarted = mesh.expect_restart(victim)
    os.kill(mesh.pids[victim], signal.SIGKILL)
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    assert await asyncio.to_thread(restarted.wait, 60)


async def test_killed_decode_replica_then_vocoder_replica_one_after_the_other(mesh, undisturbed):
    await vocoders_settled(mesh)  # the vocoder killed last time is back and serving its share
    lives, tasks = await start_streams(mesh.gateway_url, BODIES)
    owned = await owners(mesh, lives)
    decode = owned[lives[0].request_id]
    nc, subscriptions = await migrated(mesh, [live.request_id for live in lives if owned[live.request_id] == decode])
    try:
        decode_back = mesh.expect_restart(decode)
        os.kill(mesh.pids[decode], signal.SIGKILL)
        for subscription in subscriptions:  # the other decode replica (or its restarted self) took them over
            await subscription.next_msg(timeout=WAIT_S)
    finally:
        await nc.close()
    vocoder = await vocoder_of(mesh, lives[0])
    vocoder_back = mesh.expect_restart(vocoder)
    os.kill(mesh.pids[vocoder], signal.SIGKILL)
    results = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    await assert_as_undisturbed(mesh.nats_url, results, undisturbed)
    assert await asyncio.to_thread(decode_back.wait, 60) and await asyncio.to_thread(vocoder_back.wait, 60)


async def test_killed_gateway_ends_its_streams_once_and_a_resume_on_its_restarted_self_gets_the_rest(
        mesh, undisturbed):
    await assert_a_killed_gateway_s_streams_resume_whole(mesh, undisturbed)
