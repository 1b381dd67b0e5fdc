"""The skeleton every voxmesh service process shares: connect, bind, register, lease, run workers, drain."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.micro.service import Service

from messages import subjects
from services.bus.connection import connect
from services.bus.leases import LeaseKeeper
from services.bus.lifecycle import Shutdown, Worker, run_until_shutdown
from services.bus.micro import register_service
from services.bus.provision import open_bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceContext:
    """What a service's workers get: the connection, JetStream, the bucket, its micro service, its identity."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    micro: Service
    service: str  # gateway, decode, vocoder, mtp, prefill
    replica: str  # unique per process, e.g. decode-a
    shutdown: Shutdown


async def run_service(url: str | list[str], *, service: str, replica: str,
                      workers: Callable[[ServiceContext], Sequence[Worker]], version: str = "0.1.0",
                      credentials_file: Path | None = None, token: str | None = None,
                      lease_interval_s: float = 1.0, lease_ttl_s: float = 3.0, grace_s: float = 10.0,
                      install_signals: bool = True, shutdown: Shutdown | None = None) -> None:
    """Run one service process until SIGTERM/SIGINT (or `shutdown.request`), then drain and stop.

    `workers(context)` returns the service's workers; each gets the stop event. A lease worker renewing
    `lease.<replica>` every `lease_interval_s` runs beside them.
    """
    subjects.token(replica)
    shutdown = shutdown or Shutdown()
    nc = await connect(url, f"voxmesh-{service}-{replica}", credentials_file=credentials_file, token=token)
    try:
        js = nc.jetstream()
        kv = await open_bucket(js)
        micro = await register_service(nc, f"voxmesh-{service}", version=version,
                                       description=f"voxmesh {service}", metadata={"replica": replica})
    except BaseException:
        await nc.close()
        raise
    context = ServiceContext(nc, js, kv, micro, service, replica, shutdown)
    keeper = LeaseKeeper(kv, replica, service, interval_s=lease_interval_s, ttl_s=lease_ttl_s)
    if install_signals:
        shutdown.install()
    try:
        log.info("%s %s serving", service, replica)
        await run_until_shutdown(nc, shutdown, [keeper.run, _micro_stopper(micro), *workers(context)],
                                 grace_s=grace_s)
    finally:
        if install_signals:
            shutdown.uninstall()
        await _stop_quietly(micro)
        log.info("%s %s stopped (%s)", service, replica, shutdown.reason)


def _micro_stopper(micro: Service) -> Worker:
    """A worker that leaves `$SRV` discovery as soon as shutdown starts (before the connection drains)."""

    async def stop_micro(stop: asyncio.Event) -> None:
        await stop.wait()
        await micro.stop()

    return stop_micro


async def _stop_quietly(micro: Service) -> None:
    """Stop the micro service if a failure skipped the orderly stop; the connection may be closed by now."""
    try:
        await micro.stop()
    except Exception as exc:
        log.debug("micro service stop after drain: %r", exc)
