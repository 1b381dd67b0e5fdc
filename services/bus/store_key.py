"""JetStream encryption at rest for the embedded server: a key made once per store, and the server's `jetstream`
block that uses it.

The key lives beside the store (`voxmesh up` keeps it in its state directory, the compose files' nats-config step in
the server's configuration volume; mode 0600) and must outlive restarts:
a store is unreadable without the key it was written with. A store written in clear before is converted by the
server at its first start with a key.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

CIPHER = "chachapoly"


def ensure_store_key(path: Path) -> str:
    """The key in `path`, written (mode 0600) on first use."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    key = secrets.token_urlsafe(32)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return key


def encryption_block(key: str) -> str:
    """nats-server's `jetstream { cipher, key }`: every stream file encrypted under `key`."""
    return f"jetstream {{\n  cipher: {CIPHER}\n  key: {json.dumps(key)}\n}}\n"
