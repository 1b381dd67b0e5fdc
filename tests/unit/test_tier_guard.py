"""The unit tier's guard holds: a unit test that reaches for the network or a process fails, saying where it belongs."""

import socket
import subprocess
import sys

import pytest

from tests.unit.conftest import TierViolation


def test_a_unit_test_cannot_connect_to_a_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(TierViolation, match="tests/bus"):
        sock.connect(("127.0.0.1", 9))


def test_a_unit_test_cannot_listen():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(TierViolation):
        sock.bind(("127.0.0.1", 0))


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(TierViolation, match="starts no process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_unix_sockets_stay_allowed():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
