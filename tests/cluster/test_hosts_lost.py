"""A whole host lost under the spread mesh: h2 (its nats-server, a decode and a vocoder replica) has its link cut and
every process on it frozen while requests stream through both gateways and new ones come. Its leases lapse, its
decode requests migrate to h1's decode, its vocoder partitions are claimed by h3's vocoder: every request completes
with the one-host run's audio, one frame per chunk, one terminal. When the link comes back and its processes run
again, its stale replicas are fenced at their next append and stand down: requests right after play once, whole."""

from __future__ import annotations

import asyncio

import pytest

from messages import subjects
from messages.events import Migrated
from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from services.bus.claims import read_owner, read_partition
from services.bus.provision import open_bucket
from tests.support.mesh_client import FAULT_BODIES, NUM_PARTITIONS, WAIT_S, LiveStream, assert_as_undisturbed, follow
from tests.support.host_cluster import operator_client
from tests.support.host_fixtures import GREEDY, REFERENCE_BODIES, SEEDED
from tests.support.host_streams import caught_up, finish, start_through

pytestmark = pytest.mark.timeout(300)

STREAMS = (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM)
LOST = 1  # h2: nats, decode, vocoder; no gateway, so every client keeps its gateway


def reference_of(one_host_reference, bodies) -> list[LiveStream]:
    return [one_host_reference[REFERENCE_BODIES.index(body)] for body in bodies]


async def held_by_lost_host(kv, host_mesh, lives: list[LiveStream]) -> tuple[list[str], list[int]]:
    """The requests whose decode owner runs on the lost host, and the partitions its vocoder serves."""
    decode_pid = host_mesh.services[f"decode@{host_mesh.hosts[LOST].name}"].pid
    vocoder_pid = host_mesh.services[f"vocoder@{host_mesh.hosts[LOST].name}"].pid
    owned = [live.request_id for live in lives
             if f"-{decode_pid}-" in (await read_owner(kv, live.request_id)).record.replica]
    claims = [await read_partition(kv, p) for p in range(NUM_PARTITIONS)]
    partitions = [p for p, claim in enumerate(claims) if claim is not None and f"-{vocoder_pid}-" in claim.record.replica]
    return owned, partitions


async def test_a_lost_host_s_work_moves_and_its_stale_replicas_stand_down(host_mesh, one_host_reference):
    hosts, lost = host_mesh.hosts, host_mesh.hosts[LOST]
    first, second = host_mesh.gateway_urls()
    bodies = [(first, FAULT_BODIES[0]), (second, FAULT_BODIES[1]), (second, FAULT_BODIES[0]), (first, FAULT_BODIES[1])]
    nc = await operator_client(host_mesh.cluster.operator_urls(avoiding=(LOST,)))
    try:
        kv = await open_bucket(nc.jetstream())
        lives, in_flight = await start_through(bodies)
        moved, partitions = await held_by_lost_host(kv, host_mesh, lives)
        decode_pid = host_mesh.services[f"decode@{lost.name}"].pid
        assert partitions, "the lost host's vocoder serves a share of the partitions"
        migrations = [await nc.subscribe(subjects.event(request_id, Migrated.KIND)) for request_id in moved]
        decode_log = host_mesh.services[f"decode@{lost.name}"]
        vocoder_log = host_mesh.services[f"vocoder@{lost.name}"]
        since = (len(decode_log.log), len(vocoder_log.log))
        hosts.cut(lost)
        hosts.freeze(lost)
        try:
            new = [asyncio.create_task(follow(url, body, LiveStream())) for url, body in ((first, GREEDY),
                                                                                          (second, SEEDED))]
            results = await finish(in_flight + new)
            # A request the lost decode had finished before the cut has nothing to migrate (its owner stays); every
            # other one it owned is claimed anew by the live decode, and says so with a Migrated event.
            owners = [(await read_owner(kv, request_id)).record.replica for request_id in moved]
            migrated = [request_id for request_id, owner in zip(moved, owners) if f"-{decode_pid}-" not in owner]
            for request_id, subscription in zip(moved, migrations):
                if request_id in migrated:
                    await subscription.next_msg(timeout=WAIT_S)
            await assert_as_undisturbed(host_mesh.cluster.operator_urls(avoiding=(LOST,)), results,
                                        [*reference_of(one_host_reference, [body for _, body in bodies]),
                                         *reference_of(one_host_reference, (GREEDY, SEEDED))])
            claimed = [await read_partition(kv, p) for p in partitions]
            assert all(claim is not None and f"-{vocoder_log.pid}-" not in claim.record.replica
                       for claim in claimed), claimed
        finally:
            hosts.mend(lost)
            hosts.thaw(lost)
    finally:
        await nc.close()
    # The mended member may answer for a stream before it has caught up (its stale campaign forces an election), and
    # a fault that follows must find three current members: requests and counts wait until it stores what the others do.
    await host_mesh.cluster.wait_for_jetstream()
    await caught_up(lost.address, hosts[(LOST + 1) % len(hosts.hosts)].address, STREAMS)
    after = await finish([asyncio.create_task(follow(url, body, LiveStream()))
                          for url, body in ((first, SEEDED), (second, GREEDY))])
    await assert_as_undisturbed(host_mesh.cluster.operator_urls(), after,
                                reference_of(one_host_reference, (SEEDED, GREEDY)))
    for request_id in migrated:  # the stale owner's next append is refused by the cluster: it stands down
        await asyncio.to_thread(decode_log.wait_for_line, rf"request {request_id}: .*fenced out", since[0], WAIT_S)
    await asyncio.to_thread(vocoder_log.wait_for_line, r"lost partition \d+ to", since[1], WAIT_S)
    for live in results:  # nothing the stale replicas still held ended a request a second time
        assert await terminal_count_after(host_mesh, live.request_id) == 1
    await host_mesh.wait_serving()


async def terminal_count_after(host_mesh, request_id: str) -> int:
    from tests.support.mesh_client import terminal_count

    return await terminal_count(host_mesh.cluster.operator_urls(), request_id)
