"""Faults of the NATS cluster under the spread mesh (three hosts, one server each; tests/support/host_mesh.py).

- The server leading CODES (or REQUESTS), found with JetStream's API, killed with SIGKILL while requests stream and
  new ones come: every request completes with the one-host run's audio, one frame per chunk, one terminal; restarted
  on its store, the server catches up (stores what its peers store) and the mesh serves through it again.
- Two of the three servers lost (no quorum): a new request is refused with a clear 503; once both are back, the
  mesh serves again by itself, with nothing restarted but the servers.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from tests.support.mesh_client import FAULT_BODIES, WAIT_S, LiveStream, assert_as_undisturbed, follow
from tests.support.host_cluster import ELECTION_TIMEOUT_S, operator_client
from tests.support.host_fixtures import GREEDY, REFERENCE_BODIES, SEEDED
from tests.support.host_streams import caught_up, finish, start_through

pytestmark = pytest.mark.timeout(240)

STREAMS = (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM)


def reference_of(one_host_reference, bodies) -> list[LiveStream]:
    return [one_host_reference[REFERENCE_BODIES.index(body)] for body in bodies]


@pytest.mark.parametrize("stream", [CODES_STREAM, REQUESTS_STREAM])
async def test_the_server_leading_a_stream_killed_then_restarted(host_mesh, one_host_reference, stream):
    cluster = host_mesh.cluster
    first, second = host_mesh.gateway_urls()
    nc = await operator_client(cluster.operator_urls())
    victim = None
    try:
        leader = await cluster.stream_leader(nc, stream)
        victim = cluster.index_of(leader)
        lives, in_flight = await start_through([(first, FAULT_BODIES[0]), (second, FAULT_BODIES[1])])
        cluster.kill(victim)
        new = [asyncio.create_task(follow(url, body, LiveStream())) for url, body in ((first, GREEDY),
                                                                                      (second, SEEDED))]
        results = await finish(in_flight + new)
        survivors = cluster.operator_urls(avoiding=(victim,))
        await assert_as_undisturbed(survivors, results,
                                    reference_of(one_host_reference, (*FAULT_BODIES, GREEDY, SEEDED)))
        assert await cluster.stream_leader(nc, stream, not_on=leader) != leader
    finally:
        await nc.close()
        if victim is not None:  # back on its store even when the test failed: the module's other tests need it
            await asyncio.to_thread(cluster.restart, victim)
    await cluster.wait_for_jetstream()
    peer = host_mesh.hosts[(victim + 1) % len(host_mesh.hosts.hosts)].address
    await caught_up(host_mesh.hosts[victim].address, peer, STREAMS)
    after = await finish([asyncio.create_task(follow(url, body, LiveStream()))
                          for url, body in ((first, SEEDED), (second, GREEDY))])
    await assert_as_undisturbed(cluster.operator_urls(), after, reference_of(one_host_reference, (SEEDED, GREEDY)))


async def post_speech(gateway_url: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        return await client.post(f"{gateway_url}/v1/audio/speech", json={**body, "response_format": "pcm"})


async def served_again(gateway_url: str, body: dict) -> LiveStream:
    """The first request through `gateway_url` that completes, retried while the mesh answers with an error (the
    cluster electing its leaders), bounded."""
    async def attempt() -> LiveStream:
        while True:
            live = await follow(gateway_url, body, LiveStream())
            if live.end.get("type") == "audio.done":
                return live
            await asyncio.sleep(1.0)  # a client's retry after an error, as Retry-After would pace it

    return await asyncio.wait_for(attempt(), 2 * ELECTION_TIMEOUT_S)


async def test_no_quorum_refuses_new_work_with_503_and_resumes_when_quorum_returns(host_mesh, one_host_reference):
    cluster = host_mesh.cluster
    kept = 0  # h1's server stays: its gateway's client still reaches a server, which has no quorum
    lost = tuple(i for i in range(len(host_mesh.hosts.hosts)) if i != kept)
    for index in lost:
        cluster.kill(index)
    try:
        refused = await asyncio.wait_for(post_speech(host_mesh.gateway_url_of(kept), GREEDY), WAIT_S)
        assert refused.status_code == 503, (refused.status_code, refused.text[:500])
        error = refused.json()["error"]
        assert error["code"] and "retry" in error["message"], error
    finally:
        for index in lost:
            await asyncio.to_thread(cluster.restart, index)
    await cluster.wait_for_jetstream()
    results = [await served_again(url, body) for url, body in zip(host_mesh.gateway_urls(), (GREEDY, SEEDED))]
    await assert_as_undisturbed(cluster.operator_urls(), results, reference_of(one_host_reference, (GREEDY, SEEDED)))
    await host_mesh.wait_serving()
