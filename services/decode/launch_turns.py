"""The event loop's turns beside the engine thread's launches.

Decode's event loop publishes a step's codes while the engine thread launches the next step. Both run Python under
one interpreter lock, and the launch's every torch call lets the loop take the lock for up to a switch interval, so
at many streams a launch takes several times what it takes alone, more with a prompt in the step: time on the step's
critical path. `LaunchTurns` is the engine's `LaunchListener` here (given to the engine when it is built): the
loop's heavy work (a step's publishing, an arriving request's intake) awaits `launched()` first, which returns at
once unless a launch is under way, and otherwise when that launch ends (never later: the engine reports only
launches that queue work on the device, and the device's run of the step follows, which holds no lock, so that is
when the loop's work runs).

The flag is written by the engine thread and read by the loop; the interpreter lock makes each read and write
whole. A launch that begins just after the loop read "none" only costs the old contention once; a launch's end
always schedules a wake-up on the loop, which runs after any waiter registered before it, so none is left waiting.
"""

from __future__ import annotations

import asyncio

from services.engine.launch_listener import LaunchListener


class LaunchTurns(LaunchListener):
    """`launched()` for the event loop; `begins` / `ends` for the engine thread (the engine's launch listener)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._launching = False
        self._waiters: list[asyncio.Future[None]] = []
        self.num_waits = 0
        """Times the loop held work back for a launch (STATS: how often the two met)."""

    def begins(self) -> None:
        self._launching = True

    def ends(self) -> None:
        self._launching = False
        # Always: a waiter the loop is registering right now is only seen by a wake-up that runs after it.
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop has closed (a step finishing during shutdown): no one is left to wake
            pass

    async def launched(self) -> None:
        """Return once the launch under way (if any) has ended: at once when none is. One launch at most, never the
        next one too, so back-to-back launches cannot hold the loop's work back for good."""
        if not self._launching:
            return
        self.num_waits += 1
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
