"""Every service is a NATS micro service: `$SRV.PING|INFO|STATS` answered, listed by `nats micro ls`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.service import EndpointStats, Service

from messages.errors import InvalidConfig

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$")

StatsHandler = Callable[[EndpointStats], Any]
"""nats-py's hook: what `$SRV.STATS` reports as each endpoint's `data` (a JSON-serialisable value)."""


async def register_service(nc: Client, name: str, *, version: str = "0.1.0", description: str = "",
                           metadata: dict[str, str] | None = None,
                           stats_handler: StatsHandler | None = None) -> Service:
    """Start answering `$SRV` discovery for `name` (e.g. "voxmesh-decode"). Stop with `await service.stop()`.

    Add request/reply endpoints with `service.add_endpoint(...)`; each gets request, error and latency stats.
    """
    if not _NAME.match(name):
        raise InvalidConfig(f"service name {name!r} must be [A-Za-z0-9_-]+")
    if not _SEMVER.match(version):
        raise InvalidConfig(f"service version {version!r} must be semantic (e.g. 0.1.0)")
    return await add_service(nc, name=name, version=version, description=description, metadata=metadata or {},
                             stats_handler=stats_handler)
