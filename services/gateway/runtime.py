"""The gateway's running parts, held for the app's lifetime: the NATS connection, the bucket, the supervisor, the
gateway's own lease and its micro-service registration. Every background task is kept and stopped on exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

from nats.micro.service import Service

from messages import subjects
from services.bus.leases import LeaseKeeper
from services.bus.micro import register_service
from services.bus.provision import open_bucket
from services.bus_session import connect_service
from services.gateway.http.auth import parse_keys
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.repair import RepairPolicy
from services.gateway.requests.supervisor import Supervisor, SupervisorPolicy
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.requests.validation import AdmissionPolicy
from services.gateway.settings import GatewaySettings
from services.process import default_replica

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_NAME = "voxmesh-gateway"


@dataclass(slots=True)
class Gateway:
    """What the routes use.

    Attributes:
        synthesizer: starts requests and streams their audio.
        catalog: the served model, voices and languages.
        api_keys: accepted keys (empty: no authentication).
        replica: this gateway's replica name.
    """

    synthesizer: Synthesizer
    catalog: VoiceCatalog
    api_keys: tuple[bytes, ...]
    replica: str


class StoppedDuringStartup(Exception):
    """The process was asked to stop before the gateway had connected to NATS."""


@contextlib.asynccontextmanager
async def gateway_runtime(settings: GatewaySettings, shutdown: asyncio.Event | None = None) -> AsyncIterator[Gateway]:
    """Connect, bind the bucket, start supervision and the lease; on exit stop them and drain NATS.

    `shutdown` (the process's stop event) interrupts the wait for a NATS server that is not there yet."""
    catalog = VoiceCatalog.from_dir(settings.model_dir, settings.model_name)
    replica = settings.replica or default_replica("gateway")
    subjects.token(replica)
    nc = await _unless_stopped(connect_service(settings, f"{SERVICE_NAME}-{replica}"), shutdown)
    stop = asyncio.Event()
    tasks: list[asyncio.Task] = []
    service: Service | None = None
    try:
        js = nc.jetstream()
        kv = await open_bucket(js)
        supervisor = Supervisor(nc, js, kv, catalog.model, SupervisorPolicy(
            check_interval_s=settings.supervise_interval_s, vocoder_grace_s=settings.vocoder_grace_s,
            resume_window_s=settings.resume_window_s))
        synthesizer = Synthesizer(nc, js, kv, AdmissionPolicy(catalog, settings.max_text_chars,
                                                              settings.request_deadline_s),
                                  supervisor, settings.num_partitions,
                                  RepairPolicy(arrival_timeout_s=settings.redecode_timeout_s),
                                  settings.retry_after_s)
        service = await register_service(nc, SERVICE_NAME, description="voxmesh HTTP/WebSocket gateway",
                                         metadata={"replica": replica, "model": catalog.model})
        await nc.flush()  # the server has every subscription (discovery included) before we report started
        tasks = [asyncio.create_task(supervisor.run(stop), name="gateway-supervisor"),
                 asyncio.create_task(LeaseKeeper(kv, replica, "gateway").run(stop), name="gateway-lease")]
        for task in tasks:
            task.add_done_callback(_report_crash)
        log.info("gateway %s serving model %r (%d voices)", replica, catalog.model, len(catalog.speakers))
        yield Gateway(synthesizer, catalog, parse_keys(settings.api_keys), replica)
    finally:
        stop.set()
        if service is not None:
            await service.stop()
        await _finish(tasks, settings.drain_timeout_s)
        if not nc.is_closed:
            await nc.drain()


async def _unless_stopped(work: Awaitable[T], shutdown: asyncio.Event | None) -> T:
    """`work`'s result, or StoppedDuringStartup if `shutdown` is set first (then `work` is cancelled)."""
    if shutdown is None:
        return await work
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(shutdown.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise StoppedDuringStartup("stopped while waiting for the NATS server")
    return task.result()


async def _finish(tasks: list[asyncio.Task], timeout_s: float) -> None:
    """Give the tasks `timeout_s` to return after `stop`, then cancel what is left."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())
