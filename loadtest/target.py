"""Which gateway a load test may hit: loopback only unless the operator says otherwise."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from loadtest.protocol import STREAM_PATH

_WS_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


class TargetError(ValueError):
    """A gateway URL the bench refuses (malformed, or not loopback without the override).

    Attributes:
        code: `invalid_url` or `not_loopback`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; a name is never resolved (a resolver could point it anywhere)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def stream_url(gateway_url: str, *, allow_remote: bool = False) -> str:
    """The WebSocket stream endpoint of a gateway given as `http://host:port` (or `ws://...`, with or without the
    path). Raises TargetError for a non-loopback host unless `allow_remote`."""
    parts = urlsplit(gateway_url)
    scheme = _WS_SCHEMES.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise TargetError("invalid_url", f"{gateway_url!r} is not a gateway URL: use http://127.0.0.1:PORT")
    if not allow_remote and not is_loopback_host(parts.hostname):
        raise TargetError("not_loopback", f"refusing to load-test {parts.hostname}: only loopback gateways "
                                          "(127.0.0.0/8, ::1, localhost) unless you pass --allow-remote")
    path = parts.path.rstrip("/")
    if not path.endswith(STREAM_PATH):
        path += STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))
