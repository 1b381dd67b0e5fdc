"""One `voxmesh up` per state directory: an exclusive `flock` on `<state dir>/voxmesh.lock`.

A second `voxmesh up` on the same directory would start a second embedded nats-server on the same JetStream store
and meet the first one's only as timeouts; the lock makes it fail at once, naming the one that runs. The kernel
releases a `flock` when its holder exits, however it exits, so a lock file left by a dead process is simply taken
over: the pid written inside is for the message, never trusted as the lock itself.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "voxmesh.lock"


class StateDirInUse(RuntimeError):
    """Another live process holds the state directory's lock; the message names it."""


class StateLock:
    """The held lock of a state directory, released by `release()` or by the process's exit.

    The descriptor is not inherited (Python opens files close-on-exec), so child processes (nats-server, the
    services) never keep the lock alive after `voxmesh up` itself is gone.
    """

    def __init__(self, state_dir: Path, descriptor: int) -> None:
        self.path = state_dir / LOCK_FILE
        self._descriptor: int | None = descriptor

    @classmethod
    def acquire(cls, state_dir: Path, *, owner: str) -> StateLock:
        """Lock `state_dir` for this process and record `owner` (what a refused second one is told, e.g. the
        gateway URL) with the pid; StateDirInUse if a live process holds it."""
        path = state_dir / LOCK_FILE
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(descriptor)
            os.close(descriptor)
            raise StateDirInUse(f"the state directory {state_dir} is in use by another voxmesh up "
                                f"({holder or 'holder unknown'}); stop that one, or give this one its own "
                                "--state-dir and --port") from None
        record = f"pid {os.getpid()}, {owner}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, record.encode(), 0)
        return cls(state_dir, descriptor)

    def release(self) -> None:
        """Unlock (idempotent); the file stays, and a later `voxmesh up` overwrites its record."""
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing the last descriptor drops the flock
            self._descriptor = None


def _read(descriptor: int) -> str:
    return os.pread(descriptor, 4096, 0).decode(errors="replace").strip()
