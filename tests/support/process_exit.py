"""Awaiting the exit of a process that is not this one's child (a server its killed owner left), on its pidfd."""

from __future__ import annotations

import os
import select


def exits(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` has exited, or exits within `timeout_s` (Linux: its pidfd turns readable on exit, a
    zombie nobody reaps included)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(handle, select.POLLIN)
        return bool(poller.poll(timeout_s * 1000))
    finally:
        os.close(handle)
