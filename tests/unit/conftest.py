"""The unit tier's promise, enforced: no test here opens an internet socket or starts a process.

A test that needs a server, a subprocess or the network belongs in tests/bus, tests/mesh or tests/kernels; here it
fails with a message that says so. Unix sockets (asyncio's self-pipe) stay allowed, and so do the static checkers
named in STATIC_CHECKERS, which read files and start nothing.
"""

import socket
import subprocess

import os

import pytest

# Programs a unit test may run: static analysis over the source tree, no server, no network.
STATIC_CHECKERS = {
    "lint-imports": "import-linter's contracts (tests/unit/test_architecture.py)",
    "git": "the tracked files that the README's folder tree must list (tests/unit/test_readme_architecture.py)",
}


class TierViolation(RuntimeError):
    """A unit test reached for the network or a process."""


def _checkers_only(popen_init):
    def init(process, args, *rest, **kwargs):
        program = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
        if os.path.basename(str(program)) not in STATIC_CHECKERS:
            raise TierViolation(f"the unit tier starts no process ({program}): move this test to tests/bus, "
                                "tests/mesh or tests/kernels")
        return popen_init(process, args, *rest, **kwargs)
    return init


def _guarded(method):
    def call(sock, *args, **kwargs):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise TierViolation("the unit tier opens no network socket: move this test to tests/bus or tests/mesh")
        return method(sock, *args, **kwargs)
    return call


@pytest.fixture(autouse=True)
def no_network_and_no_processes(monkeypatch):
    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, _guarded(getattr(socket.socket, name)))
    monkeypatch.setattr(subprocess.Popen, "__init__", _checkers_only(subprocess.Popen.__init__))
