"""The `voxmesh-limits` KV bucket: the per-key limits every gateway of a mesh shares (issue 42).

Keys (one token per limited key: its name from the keys file, or a token standing for an unnamed key or the
anonymous tenant, never a secret):
- `rate.<key>`: the key's token bucket (tokens left, when last refilled), compare-and-set by every gateway.
- `seats.<key>`: the key's live requests, counted per gateway replica (a dead replica's seats are dropped).
- `audio.<key>.<YYYYMMDD>`: audio seconds the key's requests made on that UTC day.

Only the gateway writes this bucket (messages/permissions.py). Its values age out after `limits_ttl_s`: an idle
key's bucket is full again and its seats empty by then, and a day's total is kept past its day.
"""

from __future__ import annotations

import time

import msgspec

from messages.base import Message, NonNegInt, Seconds, UnixTime

LIMITS_BUCKET = "voxmesh-limits"
ANONYMOUS_TOKEN = "=anon"
"""The key token of the anonymous tenant (a mesh without keys): `=` is valid in a KV key, never in a key's name."""


def rate_key(limit_key: str) -> str:
    return f"rate.{limit_key}"


def seats_key(limit_key: str) -> str:
    return f"seats.{limit_key}"


def audio_key(limit_key: str, at: float | None = None) -> str:
    """The key of `limit_key`'s audio seconds on the UTC day of `at` (now when None)."""
    day = time.strftime("%Y%m%d", time.gmtime(time.time() if at is None else at))
    return f"audio.{limit_key}.{day}"


class RateState(Message, tag="rate_state", kw_only=True, frozen=True):
    """`rate.<key>`: a token bucket.

    Attributes:
        tokens: tokens left after the last admission (a request takes one).
        at: unix time the tokens were counted at (the writer's clock); the bucket refills from then on.
    """

    tokens: float
    at: UnixTime


class SeatsState(Message, tag="seats_state", kw_only=True, frozen=True):
    """`seats.<key>`: the key's live requests, per gateway replica that holds them.

    Attributes:
        held: replica name -> requests of this key it holds now (replicas with none are left out).
    """

    held: dict[str, NonNegInt] = msgspec.field(default_factory=dict)


class AudioDay(Message, tag="audio_day", kw_only=True, frozen=True):
    """`audio.<key>.<day>`: audio seconds the key's finished requests made on that UTC day.

    Attributes:
        seconds: the day's total so far.
    """

    seconds: Seconds = 0.0
