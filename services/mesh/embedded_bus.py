"""The bus `voxmesh up` runs itself: one embedded nats-server, or (`--nats-cluster N`) N of them as one JetStream
cluster on loopback, all with the same users, TLS for clients and encryption at rest (and, with TLS, mutual TLS
on the members' routes).

A cluster's members store under `<state dir>/nats-cluster/<name>` and load `<name>.conf` (server name, routes,
route credentials) beside the common `server.conf` in the users' directory. Services are given every member's URL;
provisioning makes every stream, the bucket and the object stores with min(N, 5) replicas.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client

from messages.permissions import OPERATOR_USER
from messages.streams import MAX_REPLICAS
from services.bus.embedded import EmbeddedNats
from services.bus.embedded_cluster import EmbeddedCluster
from services.bus.nats_auth import NatsAuth
from services.mesh.tls_dir import TlsDir

CLUSTER_READY_TIMEOUT_S = 60.0


@dataclass
class EmbeddedBus:
    """What `voxmesh up` started: the URL(s) services get, a line for the user, and how to stop it."""

    url: str
    description: str
    stream_replicas: int
    server: EmbeddedNats | EmbeddedCluster

    def stop(self) -> None:
        self.server.stop()


def start_single(state_dir: Path, auth: NatsAuth, server_config: Path) -> EmbeddedBus:
    """One server storing under `<state dir>/nats`."""
    nats = EmbeddedNats(state_dir / "nats", config_file=server_config)
    url = nats.start()
    return EmbeddedBus(url, f"NATS {url}, monitoring {nats.monitor_url}, users in {auth.directory}", 1, nats)


def start_cluster(size: int, state_dir: Path, auth: NatsAuth, server_config: Path, tls: TlsDir | None) -> EmbeddedBus:
    """`size` servers as one JetStream cluster on loopback; returns once every member knows the meta leader."""
    if server_config.parent != auth.directory:
        raise ValueError(f"{server_config} must lie in {auth.directory}, beside the users it includes")
    cluster = EmbeddedCluster(size, state_dir / "nats-cluster", auth.directory, include=server_config.name,
                              route_tls=tls.routes() if tls is not None else None)
    url = cluster.start()
    try:
        asyncio.run(cluster.wait_for_jetstream(lambda one: _operator(one, auth, tls), CLUSTER_READY_TIMEOUT_S))
    except BaseException:
        cluster.stop()
        raise
    monitoring = ",".join(server.monitor_url or "" for server in cluster.servers)
    return EmbeddedBus(url, f"NATS {url}, monitoring {monitoring}, users in {auth.directory}, a JetStream cluster of "
                            f"{size}", min(size, MAX_REPLICAS), cluster)


async def _operator(url: str, auth: NatsAuth, tls: TlsDir | None) -> Client:
    """A client of one member as the mesh's operator (the readiness probe asks JetStream's API)."""
    from services.bus.connection import connect
    from services.bus.tls import client_context

    context = None
    if tls is not None:
        client_cert = (tls.client_cert_file, tls.client_key_file) if tls.verifies_clients else (None, None)
        context = client_context(tls.ca_file, *client_cert)
    return await connect(url, "voxmesh-up-probe", user=OPERATOR_USER, password=auth.password(OPERATOR_USER), tls=context,
                         initial_timeout_s=CLUSTER_READY_TIMEOUT_S)
