"""One process started inside a test host (a network namespace), its output kept line by line for the test to wait
on ("Server is ready", "fenced out"), without polling a file."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

from tests.support.netns_hosts import Host


class HostProcess:
    """`argv` run in `host` with `env`; `name` says which it is in failures."""

    def __init__(self, name: str, host: Host, argv: list[str], env: dict[str, str]) -> None:
        self.name, self.host = name, host
        self.log: list[str] = []
        self._grew = threading.Condition()
        self.process = subprocess.Popen(host.command(*argv), env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        threading.Thread(target=self._read, name=f"log-{name}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._grew:
                self.log.append(line.rstrip())
                self._grew.notify_all()
        with self._grew:
            self._grew.notify_all()  # the process ended: a waiter reports it

    def wait_for_line(self, pattern: str, since: int = 0, timeout_s: float = 120.0) -> str:
        """The first line from index `since` on that matches `pattern`; RuntimeError if the process ends or none
        comes within `timeout_s`."""
        regex, deadline = re.compile(pattern), time.monotonic() + timeout_s
        with self._grew:
            index = since
            while True:
                for index in range(index, len(self.log)):
                    if regex.search(self.log[index]):
                        return self.log[index]
                index = len(self.log)
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} on {self.host.name}: no line matching {pattern!r}:\n"
                                       f"{self.tail()}")
                self._grew.wait(min(left, 1.0))

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log[-lines:])

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (and SIGCONT, should it be frozen) and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.send_signal(signal.SIGCONT)
        self.process.wait(30)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (a drain), then SIGKILL past `timeout_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
