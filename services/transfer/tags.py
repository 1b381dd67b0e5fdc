"""The UCX tag of an offer: a hash of (request id, attempt), so a stale attempt's tag never matches a newer one."""

from __future__ import annotations

import hashlib

from messages.subjects import token

_TAG_BITS = 63  # the descriptor's tag field is bounded to an int64 (msgspec); UCX takes any 64-bit value


def tag_of(request_id: str, attempt: int) -> int:
    """The tag the offer of `request_id`'s `attempt` is sent with; the same in every process and run."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be an int >= 0, got {attempt!r}")
    digest = hashlib.blake2b(f"{token(request_id)}/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _TAG_BITS)
