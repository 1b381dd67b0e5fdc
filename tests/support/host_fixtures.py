"""Session fixtures of the multi-host tests (tests/cluster/test_hosts_*.py).

- `one_host_reference`: REFERENCE_BODIES streamed together through `voxmesh up --topology replicas` on loopback (the
  one-host run every multi-host request must equal), stopped before the hosts start.
- `host_mesh`: the spread mesh (tests/support/host_mesh.py) for the whole session: hosts, cluster, services; every
  process killed, every namespace and link deleted after it.
- `no_namespace_left`: (autouse, session) fails the session if a namespace of this helper's prefix remains.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support.mesh import run_mesh
from tests.support.mesh_client import FAULT_BODIES, LiveStream, undisturbed_run
from tests.support.host_cluster import HostCluster
from tests.support.host_mesh import MESH_ENV, HostMesh
from tests.support.netns_hosts import Hosts, leftover_namespaces

FRAMES = 48
GREEDY = {"input": "Greedy words across three hosts.", "voice": "vivian", "temperature": 0,
          "max_new_tokens": FRAMES, "ignore_eos": True}
SEEDED = {"input": "Sampled words with a fixed seed.", "voice": "eric", "seed": 4242, "max_new_tokens": FRAMES,
          "ignore_eos": True}
REFERENCE_BODIES = (GREEDY, SEEDED, *FAULT_BODIES)
HOST_COUNT = 3


def can_make_hosts() -> str | None:
    """Why this machine cannot make network-namespace hosts (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI's .ci/run runs as root)"
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        return "needs iproute2's `ip` and `iptables`"
    return None


@pytest.fixture(scope="session")
def one_host_reference(tiny_checkpoint, tmp_path_factory) -> list[LiveStream]:
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("one-host"), "--topology", "replicas",
                  env=MESH_ENV) as mesh:
        return undisturbed_run(mesh.gateway_url, REFERENCE_BODIES)


@pytest.fixture(scope="session")
def host_mesh(one_host_reference, tiny_checkpoint, tmp_path_factory) -> Iterator[HostMesh]:
    reason = can_make_hosts()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("hosts")
    hosts = Hosts(HOST_COUNT).create()
    mesh = None
    try:
        cluster = HostCluster(hosts.hosts, root)
        mesh = HostMesh(hosts, cluster, tiny_checkpoint, root)
        cluster.start()
        mesh.start()
        yield mesh
    finally:
        if mesh is not None:
            hosts.thaw_all()
            mesh.stop()
        hosts.destroy()


@pytest.fixture(scope="session", autouse=True)
def no_namespace_left() -> Iterator[None]:
    yield
    left = leftover_namespaces()
    if left:
        pytest.fail(f"network namespaces left behind by the multi-host tests: {left}")
