"""The nats-server configuration voxmesh writes: its users (`include auth.conf`), JetStream encryption at rest, and
TLS for client connections. `voxmesh up` writes one for its embedded server, `voxmesh provision --write-nats-config`
one for the compose files' `nats` service; both from here, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from services.bus.nats_auth import CONFIG_NAME as AUTH_CONFIG_NAME
from services.bus.store_key import encryption_block


HANDSHAKE_FIRST_DELAY = "300ms"


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The server's certificate and key; with `client_ca_file`, clients must present a certificate it signed."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


def server_config(*, store_key: str | None, tls: ServerTls | None) -> str:
    """The configuration's text: the users from auth.conf beside it, the store encrypted under `store_key` (None:
    in clear), and client connections over TLS only (None: plain)."""
    text = f"include ./{AUTH_CONFIG_NAME}\n"
    if store_key is not None:
        text += encryption_block(store_key)
    if tls is not None:
        text += tls_block(tls)
    return text


def tls_block(tls: ServerTls) -> str:
    """nats-server's `tls { ... }`: with it every client connection must be TLS (a plain one is refused)."""
    # handshake_first with a delay: voxmesh's clients start TLS at once (so nothing goes out in clear to a server
    # that is not this one); a client that waits for the server's INFO first (the NATS CLI) still gets TLS after it.
    lines = [f"  cert_file: {json.dumps(str(tls.cert_file))}", f"  key_file: {json.dumps(str(tls.key_file))}",
             f"  handshake_first: {json.dumps(HANDSHAKE_FIRST_DELAY)}"]
    if tls.client_ca_file is not None:
        lines += [f"  ca_file: {json.dumps(str(tls.client_ca_file))}", "  verify: true"]
    return "tls {\n" + "\n".join(lines) + "\n}\n"


CONFIG_NAME = "nats.conf"
STORE_KEY_NAME = "store.key"


def write_cluster_config(directory: Path) -> Path:
    """A nats-server's whole configuration in `directory` (the compose files' `nats-config` step): its users
    (auth.conf; passwords kept from an earlier run), a password file per user, the store key (made once, kept), and
    `nats.conf`, which the server loads with `-c`. Returns nats.conf's path."""
    from services.bus.nats_auth import ensure_auth
    from services.bus.store_key import ensure_store_key

    ensure_auth(directory)
    key = ensure_store_key(directory / STORE_KEY_NAME)
    return write_server_config(directory / CONFIG_NAME, server_config(store_key=key, tls=None))


def write_server_config(path: Path, text: str) -> Path:
    """Write the configuration readable by its owner only (it holds the store key)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)
    return path
