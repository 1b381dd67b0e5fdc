"""The two buses every tool here compares, started side by side on loopback: one nats-server whose streams have one
copy (R1), and a three-server JetStream cluster whose streams have three (R3), each provisioned as `voxmesh
provision` does (the same streams, consumers, bucket and object stores; only `stream_replicas` differs)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client

from messages.streams import BusConfig
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.embedded_cluster import EmbeddedCluster, wait_for_jetstream
from services.bus.provision import provision

CLUSTER_SIZE = 3
READY_TIMEOUT_S = 90.0  # a cluster's first meta-leader election on two busy cores


@dataclass
class Bus:
    """One running bus: its label (R1, R3), the replicas of its streams and the member URLs."""

    label: str
    replicas: int
    urls: list[str]
    servers: list[EmbeddedNats] = field(default_factory=list)

    async def client(self, name: str, url: str | None = None) -> Client:
        """A client of the repo's connection helper: of one member (`url`), or of any member."""
        return await connect(url or self.urls, name, initial_timeout_s=30.0)


def bus_config(replicas: int, *, max_queued_requests: int = 100_000) -> BusConfig:
    """What the tools provision: the product's defaults, with room in REQUESTS for submits nobody consumes."""
    return BusConfig(stream_replicas=replicas, max_queued_requests=max_queued_requests)


async def _provisioned(bus: Bus) -> Bus:
    nc = await bus.client("bus-bench-provision")
    try:
        await provision(nc.jetstream(), bus_config(bus.replicas))
    finally:
        await nc.close()
    return bus


@contextlib.asynccontextmanager
async def single_bus(root: Path) -> AsyncIterator[Bus]:
    """R1: one nats-server (JetStream, file store), streams with one copy."""
    server = EmbeddedNats(root / "single", name="bench-single")
    await asyncio.to_thread(server.start)
    try:
        yield await _provisioned(Bus("R1", 1, [server.url or ""], [server]))
    finally:
        await asyncio.to_thread(server.stop)


@contextlib.asynccontextmanager
async def cluster_bus(root: Path, size: int = CLUSTER_SIZE) -> AsyncIterator[Bus]:
    """R3: `size` nats-servers as one JetStream cluster (routes on loopback), streams with min(size, 3) copies."""
    cluster = EmbeddedCluster(size, root / "cluster-stores", root / "cluster-config", name_prefix="bench")
    await asyncio.to_thread(cluster.start)
    try:
        await wait_for_jetstream(lambda url: connect(url, "bus-bench-probe", initial_timeout_s=30.0), cluster.urls,
                                 READY_TIMEOUT_S)
        replicas = min(size, 3)
        yield await _provisioned(Bus(f"R{replicas}", replicas, list(cluster.urls), list(cluster.servers)))
    finally:
        await asyncio.to_thread(cluster.stop)


@contextlib.asynccontextmanager
async def side_by_side(labels: tuple[str, ...] = ("R1", "R3")) -> AsyncIterator[dict[str, Bus]]:
    """The buses named in `labels` (R1, R3), running at once, in a temporary directory removed afterwards."""
    unknown = set(labels) - {"R1", "R3"}
    if unknown:
        raise ValueError(f"unknown bus label(s) {sorted(unknown)}: use R1 and/or R3")
    with tempfile.TemporaryDirectory(prefix="voxmesh-bus-bench-") as temp:
        root = Path(temp)
        async with contextlib.AsyncExitStack() as stack:
            buses = {}
            if "R1" in labels:
                buses["R1"] = await stack.enter_async_context(single_bus(root))
            if "R3" in labels:
                buses["R3"] = await stack.enter_async_context(cluster_bus(root))
            yield buses
