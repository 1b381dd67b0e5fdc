"""The default replica name of a service process."""

from __future__ import annotations

import os
import secrets
import socket

INCARNATION = secrets.token_hex(4)
"""Random per process start. A container restarted with the same hostname and pid (pid 1, say) gets a new name, so it
never takes a dead predecessor's claims (`owner.<id>`) for its own, nor renews the predecessor's lease."""


def default_replica(service: str) -> str:
    """A replica name unique per process start and usable as a subject token: `<service>-<host>-<pid>-<incarnation>`."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40]
    return f"{service}-{host}-{os.getpid()}-{INCARNATION}"
