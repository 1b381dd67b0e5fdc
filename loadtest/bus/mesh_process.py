"""A `voxmesh up` child on loopback for the replication bench: started, read until it serves, stopped by SIGTERM
as Ctrl-C would; its bus's URLs, monitoring and operator password read from what it printed and wrote."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

SERVING = re.compile(r"voxmesh is serving: (\S+)\s+\(NATS (\S+), monitoring (\S+),")
START_TIMEOUT_S = 300.0


@dataclass
class MeshProcess:
    label: str
    state_dir: Path
    model_dir: Path
    port: int
    extra: tuple[str, ...] = ()
    gateway_url: str = ""
    nats_urls: list[str] = field(default_factory=list)
    monitor_urls: list[str] = field(default_factory=list)
    _process: subprocess.Popen | None = None
    _tail: deque = field(default_factory=lambda: deque(maxlen=60))
    _serving: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        command = [sys.executable, "-m", "services.cli", "up", "--model", str(self.model_dir), "--state-dir",
                   str(self.state_dir), "--port", str(self.port), *self.extra]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ))
        threading.Thread(target=self._read, daemon=True, name=f"mesh-{self.label}").start()
        if not self._serving.wait(START_TIMEOUT_S) or not self.gateway_url:
            self.stop()
            raise RuntimeError(f"mesh {self.label} did not serve within {START_TIMEOUT_S}s:\n" + "\n".join(self._tail))

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._tail.append(line.rstrip())
            found = SERVING.search(line)
            if found:
                self.gateway_url = found.group(1)
                self.nats_urls = [re.sub(r"^nats://[^@/]*@", "nats://", url) for url in found.group(2).split(",")]
                self.monitor_urls = [url for url in found.group(3).split(",") if url]
                self._serving.set()
        self._serving.set()

    @property
    def operator_password(self) -> str:
        return (self.state_dir / "nats-auth" / "operator.password").read_text().strip()

    def operator_url(self, index: int = 0) -> str:
        """One member's URL with the operator's credentials in it (for tools that take a URL only)."""
        return self.nats_urls[index].replace("nats://", f"nats://operator:{self.operator_password}@", 1)

    def server_pids(self) -> list[int]:
        """The nats-server processes storing under this mesh's state dir."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "nats-server" in command and str(self.state_dir) in command:
                found.append(int(entry.name))
        return found

    def stop(self, timeout_s: float = 60.0) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                return process.wait()
        return process.returncode

    def log_tail(self) -> str:
        return "\n".join(self._tail)


