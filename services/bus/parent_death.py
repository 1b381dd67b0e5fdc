"""Children that end with the process that started them, however it ends (a SIGKILL included).

Linux's `PR_SET_PDEATHSIG` has the kernel send the child a signal when its parent goes. `die_with_parent` sets it
between fork and exec (`subprocess.Popen(preexec_fn=...)`). The kernel's "parent" is the thread that forked: the
signal comes when that thread exits, not the process. So a child that must outlive the thread that started it (a
server started from a worker thread) may be tied only where the starting thread is the main thread, which lives as
long as the process (`ties_to_process`).

It lives with the bus because the embedded nats-server (`embedded.py`) is its lowest user; `voxmesh up`'s service
processes (`services.mesh.processes`) are the other. `prctl` is looked up here, at import, not in the child: between
fork and exec only the forking thread exists, and a library lookup there could wait forever on a lock another thread
held at the fork.
"""

from __future__ import annotations

import ctypes
import signal
import threading

_PR_SET_PDEATHSIG = 1

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the normal stop paths still apply
    _prctl = None


def die_with_parent() -> None:
    """(In the child, before exec.) Ask the kernel for SIGTERM when the forking thread's process goes."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def ties_to_process() -> bool:
    """True where a child started from this thread may be tied with `die_with_parent`: the main thread only."""
    return _prctl is not None and threading.current_thread() is threading.main_thread()
