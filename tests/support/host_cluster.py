"""A three-member JetStream cluster with one nats-server in each test host (tests/support/netns_hosts.py).

Each member is configured as `voxmesh up --nats-cluster` configures its own (services.bus.cluster_config: server
name, a route to every other member with the route credentials; the users and their passwords from
services.bus.nats_auth), but listens on its host's address: clients on 4222, routes on 6222, monitoring on 8222,
fixed, since every host has its own ports. `kill(i)` / `restart(i)` crash and start a member on its store;
`stream_leader` names the member leading a stream (from JetStream's API).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from nats.aio.client import Client

from messages.permissions import OPERATOR_USER
from services.bus.cluster_config import ClusterMember, RouteCredentials, write_member_configs
from services.bus.connection import connect
from services.bus.embedded import find_nats_server
from services.bus.embedded_cluster import wait_for_jetstream
from services.bus.nats_auth import NatsAuth, write_auth
from services.bus.server_config import server_config, write_server_config
from tests.support.host_process import HostProcess
from tests.support.netns_hosts import Host

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
ELECTION_TIMEOUT_S = 60.0
"""Bound on any wait for a leader (the cluster's first, or after a fault) on a busy two-core machine."""


class HostCluster:
    """One member per host in `hosts`; configuration, users and stores under `root`."""

    def __init__(self, hosts: list[Host], root: Path) -> None:
        self.hosts = hosts
        self.root = root
        self.auth: NatsAuth = write_auth(root / "nats-auth")
        write_server_config(self.auth.directory / "server.conf", server_config(store_key=None, tls=None))
        self.members = [ClusterMember(f"node-{host.name}", host.address, ROUTE_PORT, CLIENT_PORT) for host in hosts]
        self.configs = write_member_configs(self.auth.directory, self.members, include="server.conf",
                                            credentials=RouteCredentials.fresh())
        self.servers: list[HostProcess | None] = [None] * len(hosts)

    def url_of(self, index: int, user: str | None = None) -> str:
        """Member `index`'s client URL, carrying `user`'s password when given (a test's, never a service's)."""
        address = f"{self.hosts[index].address}:{CLIENT_PORT}"
        if user is None:
            return f"nats://{address}"
        return f"nats://{user}:{self.auth.password(user)}@{address}"

    def urls(self, first: int = 0) -> list[str]:
        """Every member's URL, member `first`'s first (a service's own host's server)."""
        order = [first] + [i for i in range(len(self.hosts)) if i != first]
        return [self.url_of(i) for i in order]

    def operator_urls(self, avoiding: tuple[int, ...] = ()) -> list[str]:
        """Members' URLs as the operator, but those in `avoiding` (a member a fault takes away)."""
        return [self.url_of(i, OPERATOR_USER) for i in range(len(self.hosts)) if i not in avoiding]

    def start(self) -> None:
        for index in range(len(self.hosts)):
            self._start(index)
        asyncio.run(self.wait_for_jetstream())

    def _start(self, index: int) -> None:
        host, member = self.hosts[index], self.members[index]
        store = self.root / "stores" / member.name
        store.mkdir(parents=True, exist_ok=True)
        argv = [str(find_nats_server()), "-c", str(self.configs[member.name]), "-js", "-sd", str(store),
                "-a", host.address, "-p", str(CLIENT_PORT), "-m", str(MONITOR_PORT), "-n", member.name]
        server = HostProcess(member.name, host, argv, dict(os.environ))
        self.servers[index] = server
        server.wait_for_line("Server is ready", timeout_s=30)

    async def wait_for_jetstream(self, indices: tuple[int, ...] | None = None) -> None:
        """Until every member in `indices` (default all) answers JetStream's API: it knows the meta leader."""
        chosen = indices if indices is not None else tuple(range(len(self.hosts)))
        await wait_for_jetstream(lambda url: operator_client(url), [self.url_of(i, OPERATOR_USER) for i in chosen],
                                 ELECTION_TIMEOUT_S)

    def index_of(self, name: str) -> int:
        return next(i for i, member in enumerate(self.members) if member.name == name)

    async def stream_leader(self, nc: Client, stream: str, *, not_on: str | None = None) -> str:
        """The name of `stream`'s leader, waiting until there is one other than `not_on`."""
        async def elected() -> str:
            while True:
                try:
                    info = await nc.jetstream().stream_info(stream)
                    leader = info.cluster.leader if info.cluster is not None else None
                    if leader and leader != not_on:
                        return leader
                except Exception:  # no leader to answer yet: 503, timeout, no responders
                    pass
                await asyncio.sleep(0.2)  # the API's answer is the event; nothing announces an election to a client

        return await asyncio.wait_for(elected(), ELECTION_TIMEOUT_S)

    def kill(self, index: int) -> None:
        """SIGKILL member `index` (a crash); its store stays."""
        server = self.servers[index]
        if server is not None:
            server.kill()

    def restart(self, index: int) -> None:
        self.kill(index)
        self._start(index)

    def stop(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop(timeout_s=10)


async def operator_client(url: str | list[str], name: str = "hosts-test") -> Client:
    """A client as the operator (every URL given carries its password)."""
    return await connect(url, name, initial_timeout_s=30.0)
