"""voxmesh gateway: OpenAI-style speech over HTTP and a streaming WebSocket, in front of the mesh.

Admits requests onto REQUESTS (429 when full), streams each request's audio back in order (re-decoding lost
chunks), and ends the requests no other stage can end (queue deadline, poison, lost vocoder). Listens on
127.0.0.1:8000 by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack

import uvicorn
from fastapi import FastAPI

from services.gateway.app import create_app
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.gateway import Gateway, build_gateway
from services.gateway.settings import GatewaySettings
from services.runtime.lifecycle import ServiceContext, ServiceParts, ServiceTask, run_service
from services.usage.recorder import UsageRecorder

log = logging.getLogger(__name__)

SETTINGS = GatewaySettings

# uvicorn ends the responses still in flight at drain_timeout_s itself; the margin lets it return before the
# lifecycle would cancel it.
HTTP_CLOSE_MARGIN_S = 5.0


class HttpServerFailed(RuntimeError):
    """The HTTP server could not start (uvicorn has logged why, e.g. the port is taken)."""


async def serve(settings: GatewaySettings, stop: asyncio.Event, *,
                sockets: list[socket.socket] | None = None) -> None:
    """Serve HTTP on settings.host:settings.port (or on `sockets`, already bound) until `stop` is set, then drain
    in-flight responses."""
    catalog = VoiceCatalog.from_dir(settings.model_dir, settings.model_name)  # a bad model dir fails before NATS

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        gateway = await build_gateway(settings, catalog, context)
        return gateway_parts(settings, gateway, [http_task(create_app(gateway), settings, sockets)])

    await run_service(settings, "gateway", build, stop)


def gateway_parts(settings: GatewaySettings, gateway: Gateway, tasks: Sequence[ServiceTask]) -> ServiceParts:
    """The gateway as a service: `tasks` (the HTTP server) take requests; the supervisor ends what nobody else can
    until the responses in flight are done; the usage recorder turns terminal events into usage records (shared
    with every other gateway) until then too."""
    log.info("gateway %s serving model %r (%d voices)", gateway.replica, gateway.catalog.model,
             len(gateway.catalog.speakers))
    return ServiceParts(
        description="voxmesh HTTP/WebSocket gateway",
        metadata={"model": gateway.catalog.model},
        tasks=tasks,
        background=[ServiceTask("supervisor", gateway.synthesizer.supervisor.run),
                    ServiceTask("usage", UsageRecorder(gateway.synthesizer.nc, gateway.synthesizer.js).run)],
        grace_s=settings.drain_timeout_s + HTTP_CLOSE_MARGIN_S,
    )


def http_task(app: FastAPI, settings: GatewaySettings, sockets: list[socket.socket] | None = None) -> ServiceTask:
    """The HTTP server as a task of the service: serves until `stop`, then drains in-flight responses."""
    return ServiceTask("http", functools.partial(serve_http, app, settings, sockets))


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process runner owns SIGTERM/SIGINT and sets `stop`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(app: FastAPI, settings: GatewaySettings, sockets: list[socket.socket] | None,
                     stop: asyncio.Event) -> None:
    """Run `app` under uvicorn on the running loop; `sockets` (already bound) replace host/port (tests use it). With
    a certificate and key set, it serves HTTPS only (uvicorn's TLS)."""
    # log_config=None: uvicorn's lines go through the process's logging (service name, request id).
    config = uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="off", log_config=None,
                            log_level=settings.log_level.lower(), timeout_graceful_shutdown=settings.drain_timeout_s,
                            access_log=False, ssl_certfile=settings.tls_cert_file, ssl_keyfile=settings.tls_key_file)
    server = _Server(config)
    watcher = asyncio.create_task(_exit_when(stop, server), name="gateway-stop-watcher")
    try:
        await server.serve(sockets=sockets)
    except SystemExit:  # uvicorn exits this way when it cannot start
        raise HttpServerFailed(f"the HTTP server could not start on {settings.host}:{settings.port}") from None
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _exit_when(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    log.info("gateway stopping: draining in-flight responses (up to %.0fs)", server.config.timeout_graceful_shutdown)
    server.should_exit = True
