"""The resume window: how long a client that left may come back for its request before the request is cancelled.

One object computes the deadline, and the supervisor holds it with each request's departure instant: the supervisor
cancels a request once its window has closed, and the WebSocket resume registry (ws/resume.py) refuses a resume
then, both from the same instant and the same length, so they never disagree on whether a request is gone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResumeWindow:
    """The window's length and its deadline rule.

    Attributes:
        length_s: seconds after its client left during which a request may be resumed.
    """

    length_s: float

    def __post_init__(self) -> None:
        if self.length_s <= 0:
            raise ValueError(f"the resume window must be > 0 s, got {self.length_s}")

    def closes_at(self, left_at: float) -> float:
        """The unix time the window of a client that left at `left_at` closes."""
        return left_at + self.length_s

    def is_open(self, left_at: float, now: float) -> bool:
        """Whether a client that left at `left_at` may still come back at `now`."""
        return now < self.closes_at(left_at)
