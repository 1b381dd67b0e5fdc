"""The configuration of one member of a JetStream cluster: its name and its routes to every other member.

A member's file includes the configuration every voxmesh server has (`server_config`: users, TLS for clients,
encryption at rest) and adds `server_name` (unique: JetStream's RAFT groups name their peers by it) and a `cluster`
block: the address its routes listen on, a route to each member (a server ignores its own), and the credentials
every route must present, so that no stranger on the network joins the cluster and reads its streams. Addresses are
given, never assumed: `voxmesh up --nats-cluster 3` puts every member on loopback, a test may give each its own host.
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


def member_config(member: ClusterMember, members: list[ClusterMember], credentials: RouteCredentials, *,
                  include: str | None = None, cluster_name: str = CLUSTER_NAME) -> str:
    """The text of `member`'s configuration: `include` (a file beside it: the common server configuration), its
    server name, and its cluster block with a route to each of `members`."""
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
        "}",
    ]
    return "\n".join(lines) + "\n"


def write_member_configs(directory: Path, members: list[ClusterMember], *, include: str | None = None,
                         credentials: RouteCredentials | None = None) -> dict[str, Path]:
    """One configuration file per member in `directory` (`<name>.conf`, owner-only: it holds the route password),
    each including `include` (a file in `directory`) when given. Returns each member's file by name."""
    credentials = credentials or RouteCredentials.fresh()
    directory.mkdir(parents=True, exist_ok=True)
    return {member.name: write_server_config(directory / f"{member.name}.conf",
                                             member_config(member, members, credentials, include=include))
            for member in members}
