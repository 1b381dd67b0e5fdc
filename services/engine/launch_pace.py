"""When to queue the next overlapped step: just before the one in flight ends, not as soon as it began.

With overlapped steps the host queues step N+1 while the device runs step N. Queued at once, N+1 is fixed a whole
step before it runs, and a request that arrives meanwhile waits for N, then N+1, then joins N+2. Queued late, the
host's launch time (and a margin) before N ends, N+1 still follows N on the device without a gap, and whatever
arrived while N ran is in it. The pace learns both durations from the steps themselves: a step's device time (from
the later of the previous step's codes arriving and its own queueing, to its codes arriving; decode-only and mixed
steps apart, a prompt's prefill making a step longer), and the host's time to build and queue one.
"""

from __future__ import annotations

from collections import deque

SMOOTHING = 0.2
"""Weight of the newest sample in each moving average."""

MARGIN_S = 0.001
"""Queued this much earlier than the estimate asks: a step a little shorter than the recent ones leaves the device
no idle gap."""


class LaunchPace:
    """Moving averages of a step's device time (decode-only and mixed apart) and of its launch time, and the steps
    queued whose codes have not arrived."""

    def __init__(self, *, smoothing: float = SMOOTHING, margin_s: float = MARGIN_S) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if margin_s < 0:
            raise ValueError(f"margin_s must be >= 0, got {margin_s}")
        self.smoothing = smoothing
        self.margin_s = margin_s
        self.device_s: dict[bool, float] = {}
        """By whether the step was mixed (a prompt's prefill in it): its recent device time."""
        self.launch_s: float | None = None
        """The host's recent time to build and queue a step."""
        self._queued: deque[tuple[float, bool]] = deque()
        """(perf_counter time its launch ended, mixed) of each queued step whose codes have not arrived, oldest first."""
        self._last_arrival: float | None = None

    def launched(self, queued_at: float, seconds: float, *, mixed: bool) -> None:
        """A step was queued, its launch ending at `queued_at` after `seconds` of host time."""
        self.launch_s = self._averaged(self.launch_s, seconds)
        self._queued.append((queued_at, mixed))

    def arrived(self, at: float) -> None:
        """The oldest queued step's codes reached the host at `at`, the step after it queued before they did."""
        queued_at, mixed = self._queued.popleft()
        if self._last_arrival is not None:
            # The device ran it once the step before it was done and it was queued, whichever came later.
            began = max(self._last_arrival, queued_at)
            self.device_s[mixed] = self._averaged(self.device_s.get(mixed), at - began)
        self._last_arrival = at

    def restart(self) -> None:
        """Nothing queued now (the engine read its step in its own call, or idles): no estimate until steps overlap
        again; the averages are kept."""
        self._queued.clear()
        self._last_arrival = None

    def launch_at(self) -> float | None:
        """The perf_counter time at which to queue the step after the one in flight, or None when there is nothing
        to time it by (no step in flight after an arrival, or none of its kind measured yet)."""
        if not self._queued or self._last_arrival is None or self.launch_s is None:
            return None
        queued_at, mixed = self._queued[-1]
        device_s = self.device_s.get(mixed)
        if device_s is None:
            return None
        return max(self._last_arrival, queued_at) + device_s - self.launch_s - self.margin_s

    def _averaged(self, average: float | None, sample: float) -> float:
        return sample if average is None else average + self.smoothing * (sample - average)
