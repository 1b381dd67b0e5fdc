"""An embedded nats-server never outlives its owner's SIGKILL unnoticed: tied to the owner where it was started from
the main thread, and otherwise stopped by the next server that starts on its store (two servers on one JetStream
store corrupt it). Real processes and signals: an owner process starts the server, prints its pid, and is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.bus import EmbeddedNats, connect
from tests.support.process_exit import exits

ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 15.0

OWNER = """
import sys, threading
from pathlib import Path
from services.bus import EmbeddedNats
server = EmbeddedNats(Path(sys.argv[1]))
if sys.argv[2] == "main":
    server.start()
else:
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
print(server.pid, flush=True)
sys.stdin.read()  # until killed
"""

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux only (parent-death signal, pidfd)")


def _killed_owner(store: Path, thread: str) -> int:
    """Start an owner process whose `thread` ('main' or 'worker') starts a server on `store`, SIGKILL the owner,
    return the server's pid."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(store), thread], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = owner.stdout.readline()
    finally:
        owner.kill()
        owner.wait()
    assert line.strip().isdigit(), f"the owner printed no server pid: {line!r}"
    return int(line)


@contextlib.contextmanager
def _reaped(pid: int):
    """Kill `pid` on the way out, whatever the test found."""
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_server_started_on_the_main_thread_ends_when_its_owner_is_killed(tmp_path) -> None:
    with _reaped(_killed_owner(tmp_path / "store", "main")) as server:
        assert exits(server, EXIT_TIMEOUT_S), "the server outlived its owner's SIGKILL"


async def test_a_server_left_running_on_a_store_is_stopped_before_another_starts_there(tmp_path, caplog) -> None:
    store = tmp_path / "store"
    with _reaped(_killed_owner(store, "worker")) as leftover:
        assert not exits(leftover, 0.5), "a server started from a worker thread is not tied to its owner"
        with EmbeddedNats(store) as server:
            assert exits(leftover, 0), "the leftover server still runs beside the new one"
            assert server.pid != leftover
            nc = await connect(server.url, "leftover-test")
            assert (await nc.jetstream().account_info()).limits is not None
            await nc.close()
    assert f"a nats-server (pid {leftover}) left running by an earlier owner" in caplog.text


def test_a_stale_pid_file_is_left_alone(tmp_path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    unrelated = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (store / "nats-server.pid").write_text(str(unrelated.pid))  # a recycled pid: not a nats-server on this store
        with EmbeddedNats(store) as server:
            assert server.url is not None
        assert unrelated.poll() is None, "a process that is not this store's server was signalled"
    finally:
        unrelated.kill()
        unrelated.wait()
