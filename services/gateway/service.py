"""voxmesh gateway: OpenAI-style speech over HTTP and a streaming WebSocket, in front of the mesh.

Admits requests onto REQUESTS (429 when full), streams each request's audio back in order (re-decoding lost
chunks), and ends the requests no other stage can end (queue deadline, poison, lost vocoder). Listens on
127.0.0.1:8000 by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

SETTINGS = GatewaySettings


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process runner owns SIGTERM/SIGINT and sets `stop`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: GatewaySettings, stop: asyncio.Event) -> None:
    """Serve HTTP on settings.host:settings.port until `stop` is set, then drain in-flight responses."""
    await serve_app(create_app(settings, stop), settings, stop)


async def serve_app(app: FastAPI, settings: GatewaySettings, stop: asyncio.Event,
                    sockets: list[socket.socket] | None = None) -> None:
    """Run `app` under uvicorn on the running loop; `sockets` (already bound) replace host/port (tests use it)."""
    # log_config=None: uvicorn's lines go through the process's logging (service name, request id).
    config = uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="on", log_config=None,
                            log_level=settings.log_level.lower(), timeout_graceful_shutdown=settings.drain_timeout_s,
                            access_log=False)
    server = _Server(config)
    watcher = asyncio.create_task(_exit_when(stop, server), name="gateway-stop-watcher")
    try:
        await server.serve(sockets=sockets)
    except SystemExit:
        if not stop.is_set():  # uvicorn exits this way when the lifespan fails to start
            raise
        log.info("gateway stopped before it finished starting")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _exit_when(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    log.info("gateway stopping: draining in-flight responses (up to %.0fs)", server.config.timeout_graceful_shutdown)
    server.should_exit = True
