"""The load levels of a sweep: open-loop arrival rates and closed-loop concurrencies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from loadtest.loadgen import LoadError

Mode = Literal["open", "closed"]
MODES: tuple[Mode, ...] = ("open", "closed")
DEFAULT_RATES = (0.5, 1.0, 2.0, 4.0)
DEFAULT_CONCURRENCIES = (1, 8, 32, 64)
DEFAULT_OPEN_REQUESTS = 32
MIN_CLOSED_REQUESTS = 16


@dataclass(frozen=True, slots=True)
class Level:
    """One load level.

    Attributes:
        mode: "open" (Poisson arrivals) or "closed" (fixed concurrency).
        load: arrivals per second (open) or concurrent clients (closed).
        num_requests: requests to send at this level.
    """

    mode: Mode
    load: float
    num_requests: int

    @property
    def name(self) -> str:
        return f"open {self.load:g}/s" if self.mode == "open" else f"closed x{self.load:g}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "load": self.load, "load_unit": "requests/s" if self.mode == "open" else "clients",
                "num_requests": self.num_requests}


def plan_levels(modes: Sequence[Mode], *, rates: Sequence[float] = DEFAULT_RATES,
                concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES, num_requests: int | None = None) -> list[Level]:
    """Open-loop levels first (ascending rate), then closed-loop (ascending concurrency).

    Without `num_requests`, an open level sends DEFAULT_OPEN_REQUESTS and a closed level twice its concurrency
    (at least MIN_CLOSED_REQUESTS), so every client sends more than one request.
    """
    if num_requests is not None and num_requests <= 0:
        raise LoadError(f"the number of requests per level must be positive, got {num_requests}")
    levels: list[Level] = []
    if "open" in modes:
        for rate in sorted(rates):
            if not rate > 0:
                raise LoadError(f"arrival rates must be positive, got {rate}")
            levels.append(Level("open", float(rate), num_requests or DEFAULT_OPEN_REQUESTS))
    if "closed" in modes:
        for concurrency in sorted(concurrencies):
            if concurrency <= 0:
                raise LoadError(f"concurrencies must be positive, got {concurrency}")
            levels.append(Level("closed", concurrency, num_requests or max(MIN_CLOSED_REQUESTS, 2 * concurrency)))
    if not levels:
        raise LoadError("no load levels: give --mode open/closed/both with at least one rate or concurrency")
    return levels
