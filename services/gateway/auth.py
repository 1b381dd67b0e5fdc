"""Optional API keys: when configured, every /v1 call needs `Authorization: Bearer <key>`.

Keys are compared in constant time against every configured key (no early exit), and a refusal never says whether
the header was missing, malformed or wrong.
"""

from __future__ import annotations

import hmac

from messages.errors import ErrorCode
from services.gateway.errors import GatewayError


class Unauthorized(GatewayError):
    """No valid API key (HTTP 401; WebSocket close 1008)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, "missing or invalid API key: send Authorization: Bearer <key>",
                         status=401)


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
    offered = token.strip().encode() if scheme.lower() == "bearer" else b""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(offered, key)
    if not matched:
        raise Unauthorized()
