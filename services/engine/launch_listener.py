"""The stretch of a step in which the engine thread builds and queues it on the device, told to whoever asks.

Threads that share the engine thread's interpreter slow that stretch down: torch's operator bindings release the
interpreter lock, and a thread that runs Python meanwhile keeps it until its switch interval ends. In decode at
many streams the event loop publishing the step before's codes beside the launch stretches it to several times what
it takes alone. Told when a launch begins and ends, the event loop can hold that work for the launch's few
milliseconds and run it while the engine thread waits for the device instead.
"""

from __future__ import annotations


class LaunchListener:
    """Told when the engine thread begins and ends a step's launch; this one tells no one (an engine alone)."""

    def begins(self) -> None:
        """The engine thread starts scheduling and queueing a step (called on that thread)."""

    def ends(self) -> None:
        """The step is queued on the device, or the attempt is over (called on that thread, always after `begins`)."""
