"""One service lifecycle, written once, unwound by one AsyncExitStack:

connect -> `$SRV` micro service with the service's endpoints -> lease (renewed once, then kept renewed) -> the
service's tasks in one TaskGroup -> on stop: micro stops, tasks finish, the service drains, the lease is released
-> the connection drains and closes.

A service supplies a `ServiceBuilder`: given its context (connection, JetStream, bucket, replica name, the stop
event) and the exit stack (for its own resources), it returns its `ServiceParts`: endpoints, a STATS handler, and
two kinds of tasks:

- `tasks` take new work (intake, the HTTP server, a control loop) and return once `stop` is set;
- `background` tasks serve the work already taken (a frame loop, a supervisor) and return once the service has
  drained (`drain`, the service's hook, ran), so they keep running while the service finishes what it owns.

Every task is watched: one that raises, or returns before it was asked to, is logged with its traceback and sets
`stop`; the others get their grace period, the lease is released, and `run_service` raises ServiceFailed so the
process exits non-zero and the restart policy takes over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.micro.request import Request
from nats.micro.service import EndpointStats, Service

from messages import subjects
from services.bus.leases import LeaseKeeper
from services.bus.micro import register_service
from services.bus.provision import open_bucket
from services.bus.stoppable import unless_stopped
from services.runtime import heap
from services.runtime.common_settings import CommonSettings
from services.runtime.nats_connect import connect_service
from services.runtime.health_record import health_record
from services.runtime.replica_name import default_replica
from services.runtime.task_watch import ServiceTask, TaskWatch, settle

log = logging.getLogger(__name__)

VERSION = "0.1.0"
DEFAULT_GRACE_S = 30.0

__all__ = ["Endpoint", "ServiceBuilder", "ServiceContext", "ServiceFailed", "ServiceParts", "ServiceTask", "micro_name",
           "run_service"]


class ServiceFailed(Exception):
    """A service stopped because some of its tasks died; each one's traceback was logged when it died."""

    def __init__(self, service: str, replica: str, failures: Sequence[str]) -> None:
        super().__init__(f"{service} {replica} stopped after a failure: {'; '.join(failures)}")
        self.failures = tuple(failures)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A request/reply endpoint of the service's micro service (counted in `$SRV.STATS`)."""

    name: str
    subject: str
    handler: Callable[[Request], Awaitable[None]]
    metadata: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ServiceParts:
    """What a service supplies to the lifecycle.

    Attributes:
        description: the micro service's description (`$SRV.INFO`).
        stats: the service's counters, reported as each endpoint's data in `$SRV.STATS` (None: none).
        endpoints: request/reply endpoints beside `$SRV`.
        tasks: take new work; return once `stop` is set.
        background: serve work already taken; return once the service has drained.
        drain: run after `tasks` returned and before `background` is told to return (finish owned work).
        metadata: extra `$SRV.INFO` metadata (the replica name is always there).
        lease_interval_s: renewal period of `lease.<replica>`.
        lease_ttl_s: age after which others consider this replica dead.
        grace_s: how long each phase's tasks get to return before they are cancelled.
    """

    description: str
    stats: Callable[[], dict[str, Any]] | None = None
    endpoints: Sequence[Endpoint] = ()
    tasks: Sequence[ServiceTask] = ()
    background: Sequence[ServiceTask] = ()
    drain: Callable[[], Awaitable[None]] | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    lease_interval_s: float = 1.0
    lease_ttl_s: float = 3.0
    grace_s: float = DEFAULT_GRACE_S


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """What a builder gets: the connection, JetStream, the bucket, this process's identity, and the stop event
    (set on a signal or when a task dies; e.g. an operator's hold ends early on it)."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    service: str  # gateway, decode, vocoder
    replica: str  # unique per process, a subject token
    stop: asyncio.Event


ServiceBuilder = Callable[[ServiceContext, AsyncExitStack], Awaitable[ServiceParts]]
"""Builds a service's parts once connected; resources it opens go on the stack (closed before the connection)."""


def micro_name(service: str) -> str:
    """The micro service's name, e.g. `voxmesh-decode` (what `nats micro ls` lists)."""
    return f"voxmesh-{service}"


async def run_service(settings: CommonSettings, service: str, build: ServiceBuilder, stop: asyncio.Event, *,
                      started: asyncio.Event | None = None) -> None:
    """Run one service until `stop` is set (a signal, or a task that died), then drain and close.

    `started` (optional) is set once the service is discoverable, leased and its tasks are running. Raises
    ServiceFailed after a clean stop caused by a task that died.
    """
    replica = settings.replica or default_replica(service)
    subjects.token(replica)
    name = micro_name(service)
    async with AsyncExitStack() as stack:
        nc = await unless_stopped(connect_service(settings, f"{name}-{replica}"), stop)
        if nc is None:
            log.info("%s %s stopped while waiting for the NATS server", service, replica)
            return
        stack.push_async_callback(_drain, nc)
        js = nc.jetstream()
        context = ServiceContext(nc, js, await open_bucket(js), service, replica, stop)
        parts = await build(context, stack)
        heap.freeze_long_lived()  # after the model and its graphs are built, before the first request
        micro = await _register(context, parts)
        stack.push_async_callback(micro.stop)  # idempotent: covers a failure before the orderly stop
        await nc.flush()  # the server has every subscription (discovery included) before we report started
        if settings.health_dir is not None:
            stack.enter_context(health_record(settings.health_dir, name, micro.id, replica))
        lease = LeaseKeeper(context.kv, replica, service, interval_s=parts.lease_interval_s, ttl_s=parts.lease_ttl_s)
        await lease.renew()  # live before any task takes work: others judge our claims by this lease
        log.info("%s %s serving", service, replica)
        failures = await _run_tasks(parts, lease, micro, stop, started)
    log.info("%s %s stopped", service, replica)
    if failures:
        raise ServiceFailed(service, replica, failures)


async def _register(context: ServiceContext, parts: ServiceParts) -> Service:
    stats = parts.stats

    def stats_handler(_endpoint: EndpointStats) -> dict[str, Any]:
        return stats()

    metadata = {"replica": context.replica, **parts.metadata}
    micro = await register_service(context.nc, micro_name(context.service), version=VERSION,
                                   description=parts.description, metadata=metadata,
                                   stats_handler=stats_handler if stats is not None else None)
    for endpoint in parts.endpoints:
        await micro.add_endpoint(name=endpoint.name, subject=endpoint.subject, handler=endpoint.handler,
                                 metadata=dict(endpoint.metadata) if endpoint.metadata is not None else None)
    return micro


async def _run_tasks(parts: ServiceParts, lease: LeaseKeeper, micro: Service, stop: asyncio.Event,
                     started: asyncio.Event | None) -> list[str]:
    """The service's tasks in one TaskGroup, stopped in order; returns why tasks died (empty: none did)."""
    watch = TaskWatch(stop)
    halt = asyncio.Event()  # the service has drained: background tasks return
    release = asyncio.Event()  # everything else has returned: the lease goes last
    async with asyncio.TaskGroup() as group:
        def start(task: ServiceTask, until: asyncio.Event) -> asyncio.Task:
            return group.create_task(watch.run(task, until), name=task.name)

        lease_task = start(ServiceTask("lease", lease.run), release)
        background = [start(task, halt) for task in parts.background]
        front = [start(task, stop) for task in parts.tasks]
        if started is not None:
            started.set()
        await stop.wait()
        await micro.stop()  # leave discovery at once
        await settle(front, parts.grace_s)
        if parts.drain is not None:
            await watch.step("drain", parts.drain)
        halt.set()
        await settle(background, parts.grace_s)
        release.set()
        await settle([lease_task], parts.grace_s)
    return watch.failures


async def _drain(nc: Client) -> None:
    """In-flight messages are delivered, subscriptions close, then the connection closes. Without a server (the
    connection is reconnecting) there is nothing to deliver and no one to tell: it just closes, and what the stop
    queued meanwhile (unsubscribes, the lease's release) is lost with the socket; the lease lapses on its own."""
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except nats.errors.ConnectionReconnectingError:
        log.warning("NATS is unreachable: the connection closes without draining")
        try:
            await nc.close()
        except OSError:  # nats-py writes the queued bytes to the lost socket before it closes it
            log.info("the connection closed with bytes unsent (no server to send them to)")
