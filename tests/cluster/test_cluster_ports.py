"""An EmbeddedCluster's start when a port picked for a member is taken before the member binds it (another
process's listener on a busy host): the start comes up on fresh ports, or, taken on every try, fails naming the
port; a member that exits while the cluster forms ends the wait at once, with every member's state and log."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import services.bus.embedded_cluster as embedded_cluster
from services.bus.embedded import PortInUse
from services.bus.embedded_cluster import START_ATTEMPTS, EmbeddedCluster, wait_for_jetstream
from services.bus.errors import NatsServerError
from tests.support.nats_cluster import ELECTION_TIMEOUT_S, client

SIZE = 3


@contextlib.contextmanager
def _silent_listener(port: int) -> Iterator[socket.socket]:
    """A listener on `port` whose connections the kernel accepts and that never says a word (no NATS INFO)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        yield squatter


def _cluster(root: Path) -> EmbeddedCluster:
    return EmbeddedCluster(SIZE, root / "stores", root / "config", name_prefix="node")


async def _probe(url: str):
    return await client(url, "ports-probe")


@pytest.mark.parametrize("which", ["route_port", "client_port"])
async def test_a_port_taken_before_its_member_starts_is_picked_again(tmp_path, which) -> None:
    cluster = _cluster(tmp_path)
    taken = getattr(cluster.members[-1], which)
    with _silent_listener(taken):
        try:
            cluster.start()
            assert all(server.running for server in cluster.servers), cluster.report()
            assert taken not in {port for member in cluster.members for port in (member.route_port,
                                                                                  member.client_port)}
            assert [server.route_address for server in cluster.servers] == \
                [member.route_address for member in cluster.members]
            # the old start returned with the last member gone (its route listener failed after "ready"), and this
            # probe waited on it for its whole budget
            await wait_for_jetstream(_probe, cluster.urls, ELECTION_TIMEOUT_S)
        finally:
            cluster.stop()


async def test_a_port_picked_twice_goes_to_one_listener_only(tmp_path, monkeypatch) -> None:
    given: list[int] = []

    def each_port_twice(host: str) -> int:
        # every port comes back once more (probes are closed between picks), as a random pick now and then does
        port = given[-1] if len(given) % 2 else embedded_cluster.free_listen_port(host)
        given.append(port)
        return port

    monkeypatch.setattr(embedded_cluster, "free_port", each_port_twice)
    cluster = _cluster(tmp_path)
    ports = [port for member in cluster.members for port in (member.route_port, member.client_port)]
    assert len(set(ports)) == len(ports) == 2 * SIZE, (ports, given)
    try:
        cluster.start()
        await wait_for_jetstream(_probe, cluster.urls, ELECTION_TIMEOUT_S)
    finally:
        cluster.stop()


def test_a_port_taken_on_every_attempt_fails_naming_it(tmp_path, monkeypatch) -> None:
    with _silent_listener(0) as squatter:
        taken = squatter.getsockname()[1]
        given: list[int] = []

        def taken_first(host: str) -> int:
            # each attempt's first pick (the first member's route port) is the taken one
            port = taken if len(given) % (2 * SIZE) == 0 else embedded_cluster.free_listen_port(host)
            given.append(port)
            return port

        monkeypatch.setattr(embedded_cluster, "free_port", taken_first)
        cluster = _cluster(tmp_path)
        with pytest.raises(PortInUse) as refused:
            cluster.start()
    assert refused.value.port == taken and f"127.0.0.1:{taken}" in str(refused.value)
    assert given.count(taken) == START_ATTEMPTS, given
    assert not any(server.running for server in cluster.servers)


async def test_a_member_that_exits_while_the_cluster_forms_ends_the_wait_with_every_member_log(tmp_path) -> None:
    cluster = _cluster(tmp_path)
    cluster.start()
    try:
        cluster.kill(1)
        with pytest.raises(NatsServerError) as failed:
            await cluster.wait_for_jetstream(_probe, ELECTION_TIMEOUT_S)
        report = str(failed.value)
        assert "exited before JetStream was ready" in report, report
        assert "--- node-2 " in report and "exited (code -9)" in report, report
        for member in cluster.members:
            assert f"--- {member.name} (client " in report and f"routes {member.route_address}" in report, report
        assert report.count(": running;") == SIZE - 1, report
        assert "[INF]" in report, report
    finally:
        cluster.stop()
