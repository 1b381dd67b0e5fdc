"""The configuration of one member of a JetStream cluster: its name and its routes to every other member.

A member's file includes the configuration every voxmesh server has (`server_config`: users, TLS for clients,
encryption at rest) and adds `server_name` (unique: JetStream's RAFT groups name their peers by it) and a `cluster`
block: the address its routes listen on, a route to each member (a server ignores its own), and the credentials
every route must present, so that no stranger on the network joins the cluster and reads its streams. With
`RouteTls` the routes are mutual TLS as well (the client TLS of the included file covers client connections only):
each member presents its certificate both as the server a route dials and as the dialling side, and verifies the
other's against the CA, so that the replicated streams (request text, codes) never cross a network in clear.
Addresses are given, never assumed: `voxmesh up --nats-cluster 3` puts every member on loopback, a test may give each
its own host.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from services.bus.server_config import write_server_config

CLUSTER_NAME = "voxmesh"


@dataclass(frozen=True, slots=True)
class ClusterMember:
    """Where one member listens: `host` for clients, monitoring and routes; `route_port` for routes (fixed: every
    other member dials it); `client_port` None lets the server pick a free one (its log says which)."""

    name: str
    host: str
    route_port: int
    client_port: int | None = None

    @property
    def route_address(self) -> str:
        return f"{self.host}:{self.route_port}"


@dataclass(frozen=True, slots=True)
class RouteCredentials:
    """What members present to each other on their routes."""

    user: str
    password: str

    @classmethod
    def fresh(cls) -> RouteCredentials:
        return cls("route", secrets.token_urlsafe(24))


@dataclass(frozen=True, slots=True)
class RouteTls:
    """The certificate every member presents on its routes, in both directions (nats-server always verifies a
    route's peer): it must name the address other members dial (`ClusterMember.host`) and allow client
    authentication as well as server authentication (no extended key usage, or both); `ca_file` signed it."""

    cert_file: Path
    key_file: Path
    ca_file: Path


ROUTE_TLS_TIMEOUT_S = 5  # a handshake on a busy host; nats-server's default (0.5 s) drops routes under load


def member_config(member: ClusterMember, members: list[ClusterMember], credentials: RouteCredentials, *,
                  include: str | None = None, cluster_name: str = CLUSTER_NAME, tls: RouteTls | None = None) -> str:
    """The text of `member`'s configuration: `include` (a file beside it: the common server configuration), its
    server name, and its cluster block with a route to each of `members` (over mutual TLS with `tls`)."""
    routes = [f"nats-route://{credentials.user}:{credentials.password}@{other.route_address}"
              for other in members if other.name != member.name]
    lines = [f"include ./{include}"] if include is not None else []
    lines += [
        f"server_name: {json.dumps(member.name)}",
        "cluster {",
        f"  name: {json.dumps(cluster_name)}",
        f"  listen: {json.dumps(member.route_address)}",
        "  authorization {",
        f"    user: {json.dumps(credentials.user)}",
        f"    password: {json.dumps(credentials.password)}",
        "  }",
        f"  routes: {json.dumps(routes)}",
    ]
    if tls is not None:
        lines += [
            "  tls {",
            f"    cert_file: {json.dumps(str(tls.cert_file))}",
            f"    key_file: {json.dumps(str(tls.key_file))}",
            f"    ca_file: {json.dumps(str(tls.ca_file))}",
            f"    timeout: {ROUTE_TLS_TIMEOUT_S}",
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_member_configs(directory: Path, members: list[ClusterMember], *, include: str | None = None,
                         credentials: RouteCredentials | None = None,
                         tls: RouteTls | None = None) -> dict[str, Path]:
    """One configuration file per member in `directory` (`<name>.conf`, owner-only: it holds the route password),
    each including `include` (a file in `directory`) when given, its routes over mutual TLS with `tls`. Returns each
    member's file by name."""
    credentials = credentials or RouteCredentials.fresh()
    directory.mkdir(parents=True, exist_ok=True)
    return {member.name: write_server_config(directory / f"{member.name}.conf",
                                             member_config(member, members, credentials, include=include, tls=tls))
            for member in members}
