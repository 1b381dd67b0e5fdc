"""A real JetStream cluster for tests: three nats-servers on free loopback ports, each with a temporary store.

`nats_cluster` (module scope) starts it and waits until every member answers JetStream's API (the meta leader is
known); `NatsCluster` adds what fault tests need: the leader of a stream (from its cluster info), and killing and
restarting a member. The addresses come from the caller (`hosts`), so a tier that puts each server in a network
namespace of its own reuses it with the hosts' addresses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.bus.connection import connect
from services.bus.embedded_cluster import EmbeddedCluster, wait_for_jetstream

CLUSTER_SIZE = 3
ELECTION_TIMEOUT_S = 60.0
"""Bound on any wait for a leader (first formation, or after a kill) on a busy two-core machine."""


class NatsCluster:
    """An EmbeddedCluster with the questions fault tests ask of it."""

    def __init__(self, root: Path, size: int = CLUSTER_SIZE, hosts: list[str] | None = None) -> None:
        self.cluster = EmbeddedCluster(size, root / "stores", root / "config", hosts=hosts, name_prefix="node")

    @property
    def urls(self) -> list[str]:
        return self.cluster.urls

    def url_of(self, index: int) -> str:
        url = self.cluster.servers[index].url
        if url is None:
            raise RuntimeError(f"member {index} is not running")
        return url

    def start(self) -> None:
        self.cluster.start()
        try:
            # the cluster's own wait: a member that exits ends it at once, and its failure shows every member's log
            asyncio.run(self.cluster.wait_for_jetstream(lambda url: client(url, "cluster-probe"), ELECTION_TIMEOUT_S))
        except BaseException:
            self.cluster.stop()
            raise

    async def wait_for_jetstream(self) -> None:
        await wait_for_jetstream(lambda url: client(url, "cluster-probe"), self.urls, ELECTION_TIMEOUT_S)

    async def stream_leader(self, nc: Client, stream: str, *, not_on: str | None = None) -> str:
        """The name of `stream`'s leader (from its cluster info), waiting until there is one other than `not_on`
        (a killed member still named while the survivors elect)."""
        async def elected() -> str:
            while True:
                try:
                    info = await nc.jetstream().stream_info(stream)
                    leader = info.cluster.leader if info.cluster is not None else None
                    if leader and leader != not_on:
                        return leader
                except Exception:  # no leader to answer yet: 503, timeout, no responders
                    pass
                await asyncio.sleep(0.1)  # the API's answer is the event; nothing announces an election to a client

        return await asyncio.wait_for(elected(), ELECTION_TIMEOUT_S)

    def index_of(self, name: str) -> int:
        return self.cluster.index_of(name)

    def kill(self, index: int) -> None:
        self.cluster.kill(index)

    def restart(self, index: int) -> None:
        self.cluster.restart(index)

    def stop(self) -> None:
        self.cluster.stop()


async def client(url: str | list[str], name: str = "cluster-test") -> Client:
    """A client of the repo's own connection helper (reconnecting, backoff), for one member or a list."""
    return await connect(url, name, initial_timeout_s=20.0)


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory) -> Iterator[NatsCluster]:
    """A running three-member cluster for one test module; every server stopped (stores removed) after it."""
    cluster = NatsCluster(tmp_path_factory.mktemp("nats-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def cluster_client(nats_cluster: NatsCluster) -> AsyncIterator[Client]:
    """A client given every member's URL, for one test."""
    nc = await client(nats_cluster.urls)
    try:
        yield nc
    finally:
        await nc.close()
