"""Optional API keys: when configured, every /v1 call needs `Authorization: Bearer <key>`.

Keys are compared in constant time against every configured key (no early exit; SHA-256 digests are compared, so
not even a key's length shows in the timing), and a refusal never says whether the header was missing, malformed
or wrong.
"""

from __future__ import annotations

import hashlib
import hmac

from messages.errors import ErrorCode
from services.gateway.errors import GatewayError


class Unauthorized(GatewayError):
    """No valid API key (HTTP 401; WebSocket close 1008)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.INVALID_API_KEY, "missing or invalid API key: send Authorization: Bearer <key>")

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "WWW-Authenticate": "Bearer"}


def parse_keys(raw: str | None) -> tuple[bytes, ...]:
    """Keys from the secret setting: comma- or newline-separated; blanks ignored."""
    if not raw:
        return ()
    return tuple(key.strip().encode() for key in raw.replace("\n", ",").split(",") if key.strip())


def check_bearer(authorization: str | None, keys: tuple[bytes, ...]) -> None:
    """Raise Unauthorized unless `authorization` carries one of `keys` (no keys configured: everyone passes)."""
    if not keys:
        return
    scheme, _, token = (authorization or "").partition(" ")
    offered = hashlib.sha256(token.strip().encode() if scheme.lower() == "bearer" else b"").digest()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(offered, hashlib.sha256(key).digest())
    if not matched:
        raise Unauthorized()
