"""Requests admitted from any thread, handed to the scheduler by the thread that steps the engine.

Admission (checks, the prompt's rows) is work a request must not wait behind a step for: the decode service
runs it on its own thread while the step thread replays graphs. Only the hand-over touches the scheduler, and
only on the step thread, at the start of a step or an abort, so the scheduler itself needs no lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from services.engine.errors import DuplicateRequestError
from services.engine.scheduler import Scheduler
from services.engine.sequence import Sequence


class RequestInbox:
    """Checked requests waiting for the step thread; one lock covers the queue and the hand-over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrival = threading.Condition(self._lock)
        self._queue: deque[Sequence] = deque()
        self._ids: set[str] = set()

    def put(self, seq: Sequence, scheduler: Scheduler) -> None:
        """Queue `seq`; DuplicateRequestError if the id is already queued here or in the scheduler."""
        with self._lock:
            if seq.request_id in self._ids or scheduler.get(seq.request_id) is not None:
                raise DuplicateRequestError(f"request {seq.request_id!r} is already in the engine")
            self._queue.append(seq)
            self._ids.add(seq.request_id)
            self._arrival.notify_all()

    def wait_for_arrival(self, until: float) -> bool:
        """(On the step thread.) Block until a request is queued or `until` (perf_counter time) has passed; whether
        one is queued."""
        with self._arrival:
            while not self._queue:
                left = until - time.perf_counter()
                if left <= 0:
                    return False
                self._arrival.wait(left)
            return True

    def hand_over(self, scheduler: Scheduler) -> None:
        """(On the step thread.) Move every queued request into the scheduler's waiting queue, in arrival order."""
        with self._lock:
            while self._queue:
                seq = self._queue.popleft()
                self._ids.discard(seq.request_id)
                scheduler.add(seq)

    def get(self, request_id: str) -> Sequence | None:
        with self._lock:
            return next((seq for seq in self._queue if seq.request_id == request_id), None)

    def __len__(self) -> int:
        return len(self._queue)
