"""A nats-server left running on a store by an owner that died without stopping it, stopped before another uses it.

`EmbeddedNats` asks its server for a pid file in the store (`nats-server -P`). Two servers on one JetStream store write
the same files, which corrupts it, and nats-server does not refuse the second. A server normally ends with its owner
(`parent_death`), but not where it was started from a worker thread, nor one a version before that left. So before a
server starts on a store, one still running there (the pid file's process, if it is a nats-server whose command line
names that store) is stopped as `EmbeddedNats.stop` would: SIGTERM, so it flushes, then SIGKILL after the timeout.
Its exit is awaited through a pidfd (Linux): it is not this process's child, so it cannot be waited for otherwise.
"""

from __future__ import annotations

import logging
import os
import select
import signal
from pathlib import Path

log = logging.getLogger(__name__)

PID_FILE = "nats-server.pid"
"""In the store directory: the pid of the server that runs on it."""


def pid_file(store_dir: Path) -> Path:
    return store_dir / PID_FILE


def stop_leftover(store_dir: Path, timeout_s: float) -> int | None:
    """Stop the nats-server still running on `store_dir`, if any; its pid, or None where none runs there (or this
    platform cannot tell: no /proc, no pidfd)."""
    try:
        pid = int(pid_file(store_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    if not hasattr(os, "pidfd_open") or not _serves_store(pid, store_dir):
        return None
    try:
        exited = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        log.warning("a nats-server (pid %d) left running by an earlier owner still serves the store %s; stopping it "
                    "before a new server uses that store", pid, store_dir)
        _signal(pid, signal.SIGTERM)
        if not _wait(exited, timeout_s):
            log.warning("the leftover nats-server (pid %d) did not stop in %ss; killing it", pid, timeout_s)
            _signal(pid, signal.SIGKILL)
            _wait(exited, timeout_s)
    finally:
        os.close(exited)
    return pid


def _serves_store(pid: int, store_dir: Path) -> bool:
    """`pid` is a nats-server started with `-sd store_dir` (a recycled pid is some other process)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    arguments = [part.decode(errors="replace") for part in argv]
    if not arguments or not Path(arguments[0]).name.startswith("nats-server"):
        return False
    stores = [arguments[k + 1] for k, flag in enumerate(arguments[:-1]) if flag in ("-sd", "--store_dir")]
    return any(Path(store).resolve() == store_dir.resolve() for store in stores)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait(pidfd: int, timeout_s: float) -> bool:
    """Until the process behind `pidfd` has exited (its pidfd turns readable) or `timeout_s` passes."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))
