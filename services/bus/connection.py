"""Connecting to NATS: named connections, exponential reconnect backoff with jitter, credentials never on a flag."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(base*2^n/2, base*2^n), capped at max_s."""

    base_s: float = 0.1
    max_s: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (0-based)."""
        ceiling = min(self.max_s, self.base_s * (2 ** min(attempt, 30)))
        return random.uniform(ceiling / 2, ceiling)


async def connect(url: str | list[str], name: str, *, credentials_file: Path | None = None,
                  token: str | None = None, user: str | None = None, password: str | None = None,
                  tls: ssl.SSLContext | None = None,
                  backoff: Backoff = Backoff(), connect_timeout_s: float = 5.0,
                  initial_timeout_s: float | None = 60.0, drain_timeout_s: float = 30.0) -> Client:
    """Connect as `name` (shown by the server and `nats micro ls`); reconnect forever with `backoff`.

    The first connection is retried until `initial_timeout_s` (services may start before the server; None waits
    forever), then ConnectionError. A server that refuses the credentials ends it at once with CredentialsRefused
    (retrying cannot help, and a minute of silence would hide the cause). Credentials come from a creds file, a
    token, or a user and password that the caller read from a file or the environment, never from a flag. With `tls`
    the connection is TLS from its first byte, the server verified by it: a server without TLS (or without
    `handshake_first`) is never sent anything in clear, and no connection comes.
    """
    refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
    servers = [url] if isinstance(url, str) else list(url)
    options: dict[str, Any] = {
        "servers": servers,
        # In the order given: a service on a host with its own member of a cluster lists that member first, and
        # connects there first (nats-py would shuffle the list, and send it across the network for no reason).
        "dont_randomize": True,
        "name": name,
        "connect_timeout": connect_timeout_s,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": backoff.base_s,  # paces first-connection retries; reconnects use the handler
        "drain_timeout": drain_timeout_s,
        "reconnect_to_server_handler": _reconnect_handler(backoff),
        "error_cb": _log_error(name, refused),
        "disconnected_cb": _log_state(name, "disconnected"),
        "reconnected_cb": _log_state(name, "reconnected"),
        "closed_cb": _log_state(name, "closed"),
    }
    if credentials_file is not None:
        options["user_credentials"] = str(credentials_file)
    if token is not None:
        options["token"] = token
    if user is not None:
        options["user"] = user
        options["password"] = password
    if tls is not None:
        # TLS from the first byte (the server's `handshake_first`): nats-py would otherwise upgrade only when the
        # server asks, and send the credentials in clear to one that does not.
        options.update(tls=tls, tls_handshake_first=True)
    connecting = asyncio.ensure_future(nats.connect(**options))
    try:
        done, _ = await asyncio.wait({connecting, refused}, timeout=initial_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await stop_connecting(connecting)  # a caller that gives up takes nats-py's retry loop down with it
        raise
    if connecting in done:
        return connecting.result()
    await stop_connecting(connecting)
    if refused in done:
        raise CredentialsRefused(f"{name}: the NATS server at {servers} refused this service's credentials "
                                 f"({refused.result()}); check VOXMESH_NATS_USER and its password file, or the creds "
                                 "file") from refused.result()
    raise ConnectionError(f"{name}: no NATS server answered at {servers} within {initial_timeout_s}s")


async def stop_connecting(connecting: asyncio.Task, recheck_s: float = 0.1) -> None:
    """Cancel a first-connection attempt and wait until it has ended (its retry loop with it).

    One cancel is not always enough: nats-py swallows a cancellation that lands while it flushes (`_flush_pending`
    catches CancelledError), and its retry loop then goes on, against a server that refuses the TLS handshake for
    ever (seen as a test stuck for 15 minutes under load). So it is cancelled again until it ends."""
    while not connecting.done():
        connecting.cancel()
        await asyncio.wait({connecting}, timeout=recheck_s)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        connecting.result()  # retrieved, so asyncio does not log it as never read


class CredentialsRefused(ConnectionError):
    """The NATS server refused the credentials (an authorization violation) while connecting."""


def _reconnect_handler(backoff: Backoff):
    """nats-py's hook: pick the least-retried server and wait per the backoff."""

    def choose(servers: list, _info: dict) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        return server, backoff.delay(server.reconnects)

    return choose


def _log_error(name: str, refused: asyncio.Future):
    async def on_error(exc: Exception) -> None:
        log.warning("%s: NATS error: %r", name, exc)
        if _is_authorization_error(exc) and not refused.done():
            refused.set_result(exc)

    return on_error


def _is_authorization_error(exc: Exception) -> bool:
    """An authorization violation (bad user, password, token or creds), as nats-py reports one."""
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


def _log_state(name: str, state: str):
    async def on_state() -> None:
        log.info("%s: NATS %s", name, state)

    return on_state
