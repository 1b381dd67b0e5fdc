"""The client's view of the mtp replicas: who is live (by lease), how loaded each is, and which one gets a step.

Load is what a replica reported in its last reply (steps and rows it had taken and not answered) plus what this client
has in flight to it now; the least-loaded live replica gets the next step, ties going to the one sent the fewest
steps, then by name (so idle replicas share the work in a fixed order). A replica that timed out or had no responders
stays out until a lease renewal newer than that failure shows it alive again; one that refused our fingerprint stays
out for good (a replica with other weights keeps its name for its life).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from messages import subjects
from messages.mtp import StepReply
from messages.records import Lease
from services.bus.leases import lease_expired

MTP_SERVICE = "mtp"
"""The service name mtp replicas lease under (`Lease.service`)."""


@dataclass(slots=True)
class ReplicaState:
    """What this client knows of one replica."""

    name: str
    lease: Lease | None = None
    reported_steps: int = 0
    reported_rows: int = 0
    in_flight_steps: int = 0
    in_flight_rows: int = 0
    num_sent: int = 0
    num_answered: int = 0
    num_failed: int = 0
    unresponsive_since: float | None = None
    """Wall time of its last timeout or no-responders; cleared by a lease renewed after it."""
    incompatible: str | None = None
    """Why it refused our steps for good (another checkpoint or dtype)."""

    @property
    def load(self) -> tuple[int, int]:
        return self.reported_rows + self.in_flight_rows, self.reported_steps + self.in_flight_steps

    def is_live(self, now: float) -> bool:
        if self.lease is None or lease_expired(self.lease, now) or self.incompatible is not None:
            return False
        # Clocks of one host or NTP: a renewal after the failure means the process runs again (e.g. SIGCONT).
        return self.unresponsive_since is None or self.lease.renewed_at > self.unresponsive_since


class ReplicaSet:
    """Every mtp replica this client has seen a lease of. Touched on the event loop only."""

    def __init__(self) -> None:
        self._replicas: dict[str, ReplicaState] = {}

    def _state(self, name: str) -> ReplicaState:
        return self._replicas.setdefault(name, ReplicaState(name))

    def leased(self, lease: Lease) -> None:
        """A lease of some service was written: an mtp replica's is recorded."""
        if lease.service == MTP_SERVICE:
            self._state(lease.replica).lease = lease

    def lease_deleted(self, key: str) -> None:
        """`key` was deleted (a replica left cleanly): it is no candidate any more."""
        for state in self._replicas.values():
            if subjects.lease_key(state.name) == key:
                state.lease = None

    def live(self, now: float | None = None) -> list[str]:
        """The live replicas, sorted by name."""
        now = time.time() if now is None else now
        return sorted(name for name, state in self._replicas.items() if state.is_live(now))

    def choose(self, exclude: set[str], now: float | None = None) -> str | None:
        """The least-loaded live replica not in `exclude`; None when there is none."""
        now = time.time() if now is None else now
        candidates = [s for s in self._replicas.values() if s.name not in exclude and s.is_live(now)]
        if not candidates:
            return None
        return min(candidates, key=lambda s: (s.load, s.num_sent, s.name)).name

    def sent(self, name: str, rows: int) -> None:
        state = self._state(name)
        state.num_sent += 1
        state.in_flight_steps += 1
        state.in_flight_rows += rows

    def settled(self, name: str, rows: int) -> None:
        """One of our steps to `name` is no longer in flight (answered, failed, or its step ended)."""
        state = self._state(name)
        state.in_flight_steps -= 1
        state.in_flight_rows -= rows

    def reported(self, reply: StepReply) -> None:
        """A reply's load (a late one's too: it is still news of that replica)."""
        state = self._state(reply.replica)
        state.reported_steps, state.reported_rows = reply.queued_steps, reply.queued_rows
        if reply.error is None:
            state.num_answered += 1

    def failed(self, name: str, *, unresponsive: bool, now: float | None = None) -> None:
        state = self._state(name)
        state.num_failed += 1
        if unresponsive:
            state.unresponsive_since = time.time() if now is None else now

    def incompatible(self, name: str, why: str) -> None:
        self._state(name).incompatible = why

    def stats(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        return {name: {"live": state.is_live(now), "sent": state.num_sent, "answered": state.num_answered,
                       "failed": state.num_failed, "in_flight_steps": state.in_flight_steps,
                       "in_flight_rows": state.in_flight_rows, "reported_steps": state.reported_steps,
                       "reported_rows": state.reported_rows, "incompatible": state.incompatible}
                for name, state in sorted(self._replicas.items())}
