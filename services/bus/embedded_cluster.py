"""Several embedded nats-servers forming one JetStream cluster (`voxmesh up --nats-cluster N`, and the tests).

Each member is an EmbeddedNats with a store directory of its own, the configuration every voxmesh server has
(users, TLS for clients, encryption at rest) included in its member file (`cluster_config`), and a route to every
other member (over mutual TLS when given). Route and client ports are picked before any member starts (every member
must know the others' routes; clients given the list of URLs must find a restarted member where it was); monitoring
ports are picked by each server. A picked port can be taken by another process before its member binds it (a busy
host starts listeners all the time): the member then exits, and the start tries again on fresh ports for every
member (START_ATTEMPTS in all). A member counts as started once its client and route listeners are both open:
nats-server says it is ready before it opens the route listener, and exits after when that port is taken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Awaitable
from pathlib import Path

from nats.aio.client import Client

from services.bus.cluster_config import ClusterMember, RouteCredentials, RouteTls, write_member_configs
from services.bus.embedded import HOST, EmbeddedNats, PortInUse
from services.bus.errors import NatsServerError
from services.bus.listen_ports import NoFreePort, free_listen_port

log = logging.getLogger(__name__)

START_ATTEMPTS = 3  # fresh ports for every member on each; two collisions in a row already say something is wrong
PICKS_PER_PORT = 20  # a repeat among a few picks from thousands of ports is rare; twenty in a row is a broken picker
REPORT_LOG_LINES = 20  # each member's log lines in a readiness failure


def free_port(host: str = HOST) -> int:
    """A port free now on `host` for a member's listener (services/bus/listen_ports.py says why below the range)."""
    try:
        return free_listen_port(host)
    except NoFreePort as error:
        raise NatsServerError(str(error)) from error


def _another_port(host: str, picked: set[tuple[str, int]]) -> int:
    """A free port on `host` not in `picked` (then added to it): each pick's probe is closed before the next, so the
    same port can come back, and two listeners of one cluster given one port is a start that fails."""
    for _ in range(PICKS_PER_PORT):
        port = free_port(host)
        if (host, port) not in picked:
            picked.add((host, port))
            return port
    raise NatsServerError(f"no port on {host} beside the {len(picked)} already picked after {PICKS_PER_PORT} tries")


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
        self._hosts = hosts
        self._name_prefix = name_prefix
        self._store_root = store_root
        self._config_dir = config_dir
        self._include = include
        self._credentials = RouteCredentials.fresh()
        self._route_tls = route_tls
        self._pick_ports()

    def _pick_ports(self) -> None:
        """Pick every member's client and route ports afresh, and write the member files that name them."""
        picked: set[tuple[str, int]] = set()
        self.members = [ClusterMember(f"{self._name_prefix}-{i + 1}", host, _another_port(host, picked),
                                      _another_port(host, picked))
                        for i, host in enumerate(self._hosts)]
        self._configs = write_member_configs(self._config_dir, self.members, include=self._include,
                                             credentials=self._credentials, tls=self._route_tls)
        self.servers: list[EmbeddedNats] = [self._server(member) for member in self.members]

    def _server(self, member: ClusterMember) -> EmbeddedNats:
        return EmbeddedNats(self._store_root / member.name, port=member.client_port, name=member.name,
                            config_file=self._configs[member.name], host=member.host, listens_for_routes=True)

    @property
    def urls(self) -> list[str]:
        """Every running member's client URL."""
        return [server.url for server in self.servers if server.url is not None]

    @property
    def url(self) -> str:
        """The client URLs as one comma-separated list (what `--nats-url` takes)."""
        return ",".join(self.urls)

    def start(self) -> str:
        """Start every member (each until it accepts clients and routes; the cluster's JetStream forms after: wait
        for it with `wait_for_jetstream`); returns the URL list. A port taken since it was picked starts them all
        again on fresh ports, up to START_ATTEMPTS times; then PortInUse."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_members()
                break
            except PortInUse as taken:
                if attempt == START_ATTEMPTS:
                    raise
                log.warning("nats cluster start %d of %d: %s:%d was taken before its member bound it; picking "
                            "every port again", attempt, START_ATTEMPTS, taken.host, taken.port)
                self._pick_ports()
        log.info("nats cluster of %d: %s", len(self.servers), self.url)
        return self.url

    def _start_members(self) -> None:
        try:
            for server in self.servers:
                server.start()
        except NatsServerError:
            self.stop()
            raise

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

    async def wait_for_jetstream(self, connect: Callable[[str], Awaitable[Client]], timeout_s: float = 60.0) -> None:
        """`wait_for_jetstream` on every member, ended early by a member's exit; its NatsServerError then says, for
        each member, whether it runs and its last log lines (a failed start under load is diagnosed from these)."""
        probe = asyncio.ensure_future(wait_for_jetstream(connect, self.urls, timeout_s))
        watch = asyncio.ensure_future(self._until_a_member_exits())
        try:
            done, _ = await asyncio.wait({probe, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (probe, watch):
                task.cancel()
            await asyncio.gather(probe, watch, return_exceptions=True)
        if probe not in done:
            raise NatsServerError(f"a member of the NATS cluster {self.urls} exited before JetStream was ready\n"
                                  f"{self.report()}")
        error = probe.exception()
        if isinstance(error, NatsServerError):
            raise NatsServerError(f"{error}\n{self.report()}") from error
        if error is not None:
            raise error

    async def _until_a_member_exits(self, every_s: float = 0.1) -> None:
        # A process's exit has no event an event loop can await here (the log reader is a thread), so look.
        while all(server.running for server in self.servers):
            await asyncio.sleep(every_s)

    def report(self, lines: int = REPORT_LOG_LINES) -> str:
        """Each member: its name, URL and route address, whether it runs (or its exit code), its last log lines."""
        parts = []
        for member, server in zip(self.members, self.servers):
            state = ("running" if server.running else "not started" if server.exit_code is None
                     else f"exited (code {server.exit_code})")
            parts.append(f"--- {member.name} (client {server.url or member.client_port}, routes "
                         f"{member.route_address}): {state}; its last {lines} log lines:\n{server.log_tail(lines)}")
        return "\n".join(parts)


async def wait_for_jetstream(connect: Callable[[str], Awaitable[Client]], urls: list[str],
                             timeout_s: float = 60.0) -> None:
    """Until every member of `urls` answers a JetStream API request (which it can only once it knows the meta
    leader, the member that places streams and consumers): `connect(url)` gives a client of one member. Raises
    NatsServerError past `timeout_s`, saying where each member's probe stood."""
    stages = {url: "connecting" for url in urls}

    async def member_ready(url: str) -> None:
        nc = await connect(url)
        stages[url] = "connected, asking JetStream"
        try:
            while True:
                try:
                    await nc.jetstream().account_info()
                    stages[url] = "ready"
                    return
                except Exception as exc:  # 503 "JetStream system temporarily unavailable", timeouts, no responders
                    stages[url] = f"connected, JetStream not ready ({exc!r})"
                    log.debug("%s: JetStream not ready yet (%r)", url, exc)
                    await asyncio.sleep(0.1)  # the API's answer is the event; nothing announces the meta leader
        finally:
            await nc.close()

    probes = [asyncio.ensure_future(member_ready(url)) for url in urls]
    try:
        done, pending = await asyncio.wait(probes, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # on the way out, cancelled or not, no probe is left running or with its outcome unread
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
    for probe in done:
        if probe.exception() is not None:
            raise probe.exception()
    if pending:
        where = "; ".join(f"{url}: {stage}" for url, stage in stages.items())
        raise NatsServerError(f"the NATS cluster {urls} had no JetStream meta leader within {timeout_s}s ({where})")
