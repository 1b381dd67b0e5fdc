"""Several embedded nats-servers forming one JetStream cluster (`voxmesh up --nats-cluster N`, and the tests).

Each member is an EmbeddedNats with a store directory of its own, the configuration every voxmesh server has
(users, TLS for clients, encryption at rest) included in its member file (`cluster_config`), and a route to every
other member (over mutual TLS when given). Route and client ports are picked before any member starts (every member must know the others' routes; clients
given the list of URLs must find a restarted member where it was); monitoring ports are picked by each server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Awaitable
from pathlib import Path

from nats.aio.client import Client

from services.bus.cluster_config import ClusterMember, RouteCredentials, RouteTls, write_member_configs
from services.bus.embedded import HOST, EmbeddedNats
from services.bus.errors import NatsServerError
from services.bus.listen_ports import NoFreePort, free_listen_port

log = logging.getLogger(__name__)

def free_port(host: str = HOST) -> int:
    """A port free now on `host` for a member's listener (services/bus/listen_ports.py says why below the range)."""
    try:
        return free_listen_port(host)
    except NoFreePort as error:
        raise NatsServerError(str(error)) from error


class EmbeddedCluster:
    """`size` nats-servers as one JetStream cluster. Use as `with`, or call start()/stop().

    store_root: member i stores under store_root/<name>. config_dir: where the member files go; with `include`, the
    name of a file in it that every member loads first (`voxmesh up`'s server.conf: users, TLS, store key).
    hosts: each member's address (default: loopback for all). route_tls: the routes over mutual TLS (None: in clear,
    with their credentials only).
    """

    def __init__(self, size: int, store_root: Path, config_dir: Path, *, include: str | None = None,
                 hosts: list[str] | None = None, name_prefix: str = "voxmesh",
                 route_tls: RouteTls | None = None) -> None:
        if size < 1:
            raise NatsServerError(f"a cluster needs at least one server, not {size}")
        hosts = hosts or [HOST] * size
        if len(hosts) != size:
            raise NatsServerError(f"{len(hosts)} hosts given for {size} servers")
        self.members = [ClusterMember(f"{name_prefix}-{i + 1}", host, free_port(host), free_port(host))
                        for i, host in enumerate(hosts)]
        self._store_root = store_root
        self._configs = write_member_configs(config_dir, self.members, include=include,
                                             credentials=RouteCredentials.fresh(), tls=route_tls)
        self.servers: list[EmbeddedNats] = [self._server(member) for member in self.members]

    def _server(self, member: ClusterMember) -> EmbeddedNats:
        return EmbeddedNats(self._store_root / member.name, port=member.client_port, name=member.name,
                            config_file=self._configs[member.name], host=member.host)

    @property
    def urls(self) -> list[str]:
        """Every running member's client URL."""
        return [server.url for server in self.servers if server.url is not None]

    @property
    def url(self) -> str:
        """The client URLs as one comma-separated list (what `--nats-url` takes)."""
        return ",".join(self.urls)

    def start(self) -> str:
        """Start every member (each until it accepts clients; the cluster's JetStream forms after: wait for it with
        `wait_for_jetstream`); returns the URL list."""
        try:
            for server in self.servers:
                server.start()
        except NatsServerError:
            self.stop()
            raise
        log.info("nats cluster of %d: %s", len(self.servers), self.url)
        return self.url

    def index_of(self, name: str) -> int:
        """The position of the member called `name` (as a stream's cluster info names its leader)."""
        for index, member in enumerate(self.members):
            if member.name == name:
                return index
        raise NatsServerError(f"no member called {name!r} in {[m.name for m in self.members]}")

    def kill(self, index: int) -> None:
        """SIGKILL member `index` (a crash: nothing flushed, no goodbye); its store stays for a restart."""
        self.servers[index].kill()

    def restart(self, index: int) -> str:
        """Start member `index` again (killing it first if it runs) on its client port and store."""
        old = self.servers[index]
        old.kill()
        old.stop()
        self.servers[index] = self._server(self.members[index])
        return self.servers[index].start()

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL past its timeout)."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def wait_for_jetstream(connect: Callable[[str], Awaitable[Client]], urls: list[str],
                             timeout_s: float = 60.0) -> None:
    """Until every member of `urls` answers a JetStream API request (which it can only once it knows the meta
    leader, the member that places streams and consumers): `connect(url)` gives a client of one member. Raises
    NatsServerError past `timeout_s`."""
    async def member_ready(url: str) -> None:
        nc = await connect(url)
        try:
            while True:
                try:
                    await nc.jetstream().account_info()
                    return
                except Exception as exc:  # 503 "JetStream system temporarily unavailable", timeouts, no responders
                    log.debug("%s: JetStream not ready yet (%r)", url, exc)
                    await asyncio.sleep(0.1)  # the API's answer is the event; nothing announces the meta leader
        finally:
            await nc.close()

    try:
        await asyncio.wait_for(asyncio.gather(*(member_ready(url) for url in urls)), timeout_s)
    except asyncio.TimeoutError as exc:
        raise NatsServerError(f"the NATS cluster {urls} had no JetStream meta leader within {timeout_s}s") from exc
