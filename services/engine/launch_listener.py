"""The stretch of a step in which the engine thread builds and queues it on the device, told to whoever asks.

Threads that share the engine thread's interpreter slow that stretch down: torch's operator bindings release the
interpreter lock, and a thread that runs Python meanwhile keeps it until its switch interval ends. In decode at 64
streams on an H200 a step's launch took 4.0 ms (5.4 with a prompt in it) where alone it takes 1.5 (1.8), because the
event loop published the step before's codes beside it (loadtest/RESULTS-GPU.md, 2026-12-03 sixth session). Told
when a launch begins and ends, the event loop can hold that work for the ~2 ms and run it while the engine thread
waits for the device instead.
"""

from __future__ import annotations


class LaunchListener:
    """Told when the engine thread begins and ends a step's launch; this one tells no one (an engine alone)."""

    def begins(self) -> None:
        """The engine thread starts scheduling and queueing a step (called on that thread)."""

    def ends(self) -> None:
        """The step is queued on the device, or the attempt is over (called on that thread, always after `begins`)."""
