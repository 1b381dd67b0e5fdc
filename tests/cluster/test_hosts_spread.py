"""The `replicas` mesh spread over three hosts (network namespaces), one member of a three-server JetStream cluster
on each (tests/support/host_mesh.py): each service talks to its own host's server, and requests through either
gateway, greedy or seeded, give the audio of the same requests on one host, with one frame per chunk and one
terminal event."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.mesh_client import WAIT_S, LiveStream, assert_as_undisturbed, follow
from tests.support.host_fixtures import GREEDY, REFERENCE_BODIES, SEEDED
from tests.support.host_mesh import PLACEMENT

pytestmark = pytest.mark.timeout(300)

SERVICE_USERS = {"gateway", "decode", "vocoder"}


def test_each_service_is_on_its_host_and_connected_to_its_host_s_server(host_mesh):
    # Read when the mesh started (a fault test that ran before may have moved connections since).
    for index, roles in enumerate(PLACEMENT):
        address = host_mesh.hosts[index].address
        services = [c for c in host_mesh.first_connections[index] if c.get("authorized_user") in SERVICE_USERS]
        assert {c["authorized_user"] for c in services} == set(roles), (index, services)
        assert {c["ip"] for c in services} == {address}, "every service connects from its own host's address"


async def stream_together(urls_and_bodies: list[tuple[str, dict]]) -> list[LiveStream]:
    return list(await asyncio.wait_for(asyncio.gather(*(follow(url, body, LiveStream())
                                                        for url, body in urls_and_bodies)), WAIT_S))


async def test_requests_through_both_gateways_equal_the_one_host_run(host_mesh, one_host_reference):
    reference = [one_host_reference[REFERENCE_BODIES.index(body)] for body in (GREEDY, SEEDED)]
    first, second = host_mesh.gateway_urls()
    results = await stream_together([(first, GREEDY), (first, SEEDED), (second, GREEDY), (second, SEEDED)])
    await assert_as_undisturbed(host_mesh.cluster.operator_urls(), results, reference * 2)
    assert len({live.request_id for live in results}) == len(results)
