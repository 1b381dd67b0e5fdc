"""The default replica name of a service process."""

from __future__ import annotations

import os
import socket


def default_replica(service: str) -> str:
    """A replica name unique per process and usable as a subject token: `<service>-<host>-<pid>`."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40]
    return f"{service}-{host}-{os.getpid()}"
