"""Watched tasks: a task of a service that dies, or returns before it was told to, stops the whole service (the
restart policy then takes over); none is left to die silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

TaskRun = Callable[[asyncio.Event], Awaitable[None]]
"""A task's body: runs until the event it is given is set, then returns."""


@dataclass(frozen=True, slots=True)
class ServiceTask:
    """A named task of a service (the name shows in logs and in the failure that stops the service)."""

    name: str
    run: TaskRun


class TaskWatch:
    """Runs a service's tasks; a task that dies (or returns unasked) is logged with its traceback and sets `stop`.

    `failures` says why, one line per death (empty: none).
    """

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.failures: list[str] = []

    async def run(self, task: ServiceTask, until: asyncio.Event) -> None:
        try:
            await task.run(until)
        except Exception as exc:  # noqa: BLE001 - any death stops the service; CancelledError passes through
            log.exception("task %s died; stopping the service", task.name)
            self._fail(f"task {task.name} died: {exc!r}")
            return
        if not until.is_set():
            log.error("task %s returned before it was asked to stop; stopping the service", task.name)
            self._fail(f"task {task.name} returned before it was asked to stop")

    async def step(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run one shutdown step; a failure is recorded and the shutdown goes on."""
        try:
            await body()
        except Exception as exc:  # noqa: BLE001 - the lease must still be released and the connection drained
            log.exception("%s failed", name)
            self.failures.append(f"{name} failed: {exc!r}")

    def _fail(self, why: str) -> None:
        self.failures.append(why)
        self.stop.set()


async def settle(tasks: Sequence[asyncio.Task], grace_s: float) -> None:
    """Give the tasks `grace_s` to return after being told to, then cancel what is left."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    for task in pending:
        log.warning("task %s did not return within %.1fs; cancelling it", task.get_name(), grace_s)
        task.cancel()
    if pending:
        await asyncio.wait(pending)
