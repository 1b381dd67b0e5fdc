"""A port for a listener about to start: free now, and below the kernel's ephemeral range.

The kernel gives outgoing connections their local port from the ephemeral range (32768-60999 on Linux by default),
so a port picked there can be taken by any client socket between the pick and the listener's bind: a mesh's own
connections are plenty of those. Below the range only listeners compete, and they bind what they are given.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST_PICKED_PORT = 20000


class NoFreePort(RuntimeError):
    """No port in the range could be bound."""


def free_listen_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`, between LOWEST_PICKED_PORT and the ephemeral range."""
    ceiling = first_ephemeral_port()
    for _ in range(200):
        port = random.randrange(LOWEST_PICKED_PORT, ceiling)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise NoFreePort(f"no free port on {host} in {LOWEST_PICKED_PORT}..{ceiling - 1} after 200 tries")


def first_ephemeral_port() -> int:
    """The low end of Linux's ephemeral port range (32768 where the kernel does not say, or it leaves no room)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > LOWEST_PICKED_PORT + 1000 else 32768
