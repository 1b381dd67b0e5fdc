"""Graceful shutdown: SIGTERM/SIGINT set an event; workers see it and finish; then the connection drains.

Every worker is a task of one TaskGroup: a worker that fails stops the others, and nothing outlives the service.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client

log = logging.getLogger(__name__)

Worker = Callable[[asyncio.Event], Awaitable[None]]


class Shutdown:
    """The stop request of a service. `install()` routes SIGTERM/SIGINT to it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None
        self._installed: list[signal.Signals] = []

    def request(self, reason: str) -> None:
        """Ask the service to stop (idempotent; the first reason is kept)."""
        if not self.event.is_set():
            self.reason = reason
            log.info("shutdown requested: %s", reason)
        self.event.set()

    def install(self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> None:
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, self.request, f"signal {sig.name}")
            self._installed.append(sig)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed.clear()


async def run_until_shutdown(nc: Client, shutdown: Shutdown, workers: Sequence[Worker], *,
                             grace_s: float = 10.0) -> None:
    """Run `workers(stop_event)` until shutdown is requested, then give them `grace_s` to return, cancel the rest,
    and drain `nc` (in-flight messages are delivered, subscriptions close). A failing worker stops the service."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_guard(worker, shutdown), name=getattr(worker, "__qualname__", "worker"))
                     for worker in workers]
            await shutdown.event.wait()
            _, pending = await asyncio.wait(tasks, timeout=grace_s) if tasks else (set(), set())
            for task in pending:
                log.warning("worker %s did not stop within %.1fs; cancelling", task.get_name(), grace_s)
                task.cancel()
    finally:
        if not nc.is_closed:
            await nc.drain()


async def _guard(worker: Worker, shutdown: Shutdown) -> None:
    try:
        await worker(shutdown.event)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        shutdown.request(f"worker failed: {exc!r}")
        raise
