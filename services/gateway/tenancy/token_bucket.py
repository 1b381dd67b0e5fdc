"""Token-bucket arithmetic, apart from where the bucket is kept (tenancy/shared_limits.py keeps it on the bus).

A bucket holds at most `size` tokens and refills at `rate` per second; a request takes one token or is refused
with the seconds until one is back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BucketState:
    """Tokens left, counted at unix time `at`."""

    tokens: float
    at: float


@dataclass(frozen=True, slots=True)
class Take:
    """The outcome of taking one token.

    Attributes:
        admitted: a token was taken.
        state: the bucket after the attempt (what to store when admitted).
        remaining: whole tokens left after it.
        reset_s: seconds until the bucket is full again.
        retry_after_s: when refused, seconds until a token is back; 0 when admitted.
    """

    admitted: bool
    state: BucketState
    remaining: int
    reset_s: float
    retry_after_s: float


def refilled(state: BucketState | None, rate: float, size: float, now: float) -> BucketState:
    """The bucket at `now`: `state` plus what `rate` refilled since, capped at `size` (a new bucket is full). A
    clock behind the stored time (another gateway's clock ahead) refills nothing, never drains."""
    if state is None:
        return BucketState(size, now)
    elapsed = max(0.0, now - state.at)
    return BucketState(min(size, state.tokens + elapsed * rate), max(now, state.at))


def take_one(state: BucketState | None, rate: float, size: float, now: float) -> Take:
    """Take one token from the bucket as it is at `now`."""
    current = refilled(state, rate, size, now)
    if current.tokens >= 1.0:
        after = BucketState(current.tokens - 1.0, current.at)
        return Take(True, after, math.floor(after.tokens), (size - after.tokens) / rate, 0.0)
    return Take(False, current, 0, (size - current.tokens) / rate, (1.0 - current.tokens) / rate)
