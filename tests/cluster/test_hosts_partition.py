"""A host partitioned from the others but alive: h3 (its nats-server, a gateway, a vocoder) loses its traffic with h1
and h2 while its gateway's clients still reach it, requests streaming through both gateways and new ones coming.
The majority side (h1, h2) serves its gateway's clients whole, with the one-host run's audio. The partitioned side's
clients get either their audio or one clear error after valid audio, never silence (the gateway, hearing neither
audio nor EVENTS for --bus-outage-s, ends the stream with `bus_unavailable`; a new request it cannot queue gets it
too). No request ends twice (the
ownership fencing holds across the partition), and once the partition heals the mesh serves through both gateways.
"""

from __future__ import annotations

import asyncio

import pytest

from messages.streams import EVENTS_STREAM
from tests.support.mesh_client import (FAULT_BODIES, WAIT_S, LiveStream, assert_as_undisturbed, follow, terminal_count)
from tests.support.host_fixtures import GREEDY, REFERENCE_BODIES, SEEDED
from tests.support.host_streams import caught_up, finish, start_through

pytestmark = pytest.mark.timeout(300)

PARTITIONED = 2  # h3: nats, gateway, vocoder
MAJORITY_GATEWAY, PARTITIONED_GATEWAY = 0, 2


def reference_of(one_host_reference, bodies) -> list[LiveStream]:
    return [one_host_reference[REFERENCE_BODIES.index(body)] for body in bodies]


def assert_audio_or_one_clear_error(live: LiveStream, reference: LiveStream) -> None:
    """Whole audio equal to the reference, or an error with a code after a prefix of the reference's audio."""
    if live.end.get("type") == "audio.done":
        assert live.pcm == reference.pcm and len(live.frames) == live.end["chunk_count"], live.request_id
        return
    assert live.end.get("type") == "error" and live.end.get("code"), ("never silence", live.end, live.closed)
    assert reference.pcm.startswith(live.pcm), "the audio before the error is the request's own"


async def test_a_partitioned_host_s_clients_get_audio_or_one_error_and_nothing_is_owned_twice(host_mesh,
                                                                                             one_host_reference):
    hosts, cut_off = host_mesh.hosts, host_mesh.hosts[PARTITIONED]
    majority = host_mesh.gateway_url_of(MAJORITY_GATEWAY)
    partitioned = host_mesh.gateway_url_of(PARTITIONED_GATEWAY)
    lives, in_flight = await start_through([(majority, FAULT_BODIES[0]), (partitioned, FAULT_BODIES[1])])
    hosts.isolate(cut_off)
    try:
        new = [asyncio.create_task(follow(url, body, LiveStream())) for url, body in ((majority, SEEDED),
                                                                                      (partitioned, GREEDY))]
        kept, lost, kept_new, lost_new = await finish(in_flight + new)
        majority_urls = host_mesh.cluster.operator_urls(avoiding=(PARTITIONED,))
        await assert_as_undisturbed(majority_urls, [kept, kept_new],
                                    reference_of(one_host_reference, (FAULT_BODIES[0], SEEDED)))
        assert_audio_or_one_clear_error(lost, reference_of(one_host_reference, (FAULT_BODIES[1],))[0])
        assert_audio_or_one_clear_error(lost_new, reference_of(one_host_reference, (GREEDY,))[0])
    finally:
        hosts.rejoin(cut_off)
    await host_mesh.cluster.wait_for_jetstream()
    # The rejoined member may answer for EVENTS before it has caught up (its stale campaign forces an election):
    # terminals are counted once it stores what a majority member stores.
    await caught_up(cut_off.address, hosts[MAJORITY_GATEWAY].address, (EVENTS_STREAM,))
    for live in (kept, lost, kept_new, lost_new):
        if live.start:  # a request refused before it was queued has no events
            assert await asyncio.wait_for(terminal_count(host_mesh.cluster.operator_urls(), live.request_id),
                                          WAIT_S) == 1
    await host_mesh.wait_serving()
    after = await finish([asyncio.create_task(follow(url, body, LiveStream()))
                          for url, body in ((majority, GREEDY), (partitioned, SEEDED))])
    await assert_as_undisturbed(host_mesh.cluster.operator_urls(), after,
                                reference_of(one_host_reference, (GREEDY, SEEDED)))
