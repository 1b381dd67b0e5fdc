"""A fresh mesh per trial: `voxmesh up` in a child process with its own empty state directory and a free loopback
port, ready once it prints its "serving" line (printed after the gateway's /ready answered), stopped as Ctrl-C
would (SIGINT, then a kill if it outlasts STOP_TIMEOUT_S).

The same line names the mesh's embedded NATS and the folder of its users' passwords: the bench reads the mesh's
lifecycle events through it as the read-only `observer` user, so each trial's first packets are broken into stages
as `--events-url` gives for a mesh the bench did not start. A mesh on an outside bus (`--nats-url`) names no users
folder: its trials are measured without the breakdown.

The bench owns `--port` and `--state-dir`; every other `voxmesh up` flag (`--model`, `--device`, `--topology`...)
is passed through. Without `--model`, each trial's mesh writes the tiny random checkpoint into its state directory
first (that time is before the mesh is ready, so no figure includes it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from loadtest.bench.workload import REPO_ROOT
from services.bus.listen_ports import NoFreePort, free_listen_port

SERVING = re.compile(r"voxmesh is serving: (\S+)")
EMBEDDED_BUS = re.compile(r"\(NATS (nats://[^\s,]+).*?, users in ([^,)]+)")
"""The embedded NATS (its first member's URL on a cluster) and the users' folder, in the serving line."""
OBSERVER = "observer"
"""The read-only user `voxmesh up` makes: enough to read EVENTS back."""
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 120.0
OWNED_FLAGS = ("--port", "--state-dir")
_TAIL_LINES = 40


class MeshStartError(RuntimeError):
    """The fresh mesh did not start (bad flags, a service that exited, no "serving" line in time).

    Attributes:
        code: `mesh_failed` or `invalid_up_args`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class FreshMesh:
    """A running fresh mesh: its gateway, and a URL with the observer's credentials for its events (None where the
    mesh's bus is not its own)."""

    gateway_url: str
    events_url: str | None


def observer_events_url(serving_line: str) -> str | None:
    """From `voxmesh up`'s serving line: its NATS URL with the observer's password in it, or None where the line
    names no embedded bus or its users' folder holds no observer password."""
    match = EMBEDDED_BUS.search(serving_line)
    if match is None:
        return None
    nats_url, users = match.group(1), Path(match.group(2).strip())
    password_file = users / f"{OBSERVER}.password"
    if not password_file.is_file():
        return None
    password = quote(password_file.read_text().strip(), safe="")
    return nats_url.replace("://", f"://{OBSERVER}:{password}@", 1)


def free_port() -> int:
    """A loopback port free now for the mesh's gateway (below the ephemeral range: listen_ports says why)."""
    try:
        return free_listen_port("127.0.0.1")
    except NoFreePort as error:
        raise MeshStartError("mesh_failed", str(error)) from error


@dataclass(frozen=True, slots=True)
class MeshLauncher:
    """Starts `voxmesh up UP_ARGS` meshes.

    Attributes:
        up_args: flags for `voxmesh up` besides --port and --state-dir.
        log_dir: where each mesh's output goes (`<name>.log`); None keeps only its last lines, for errors.
        start_timeout_s: the longest wait for the "serving" line.
    """

    up_args: tuple[str, ...] = ()
    log_dir: Path | None = None
    start_timeout_s: float = START_TIMEOUT_S

    def __post_init__(self) -> None:
        owned = [word for word in self.up_args if word.split("=", 1)[0] in OWNED_FLAGS]
        if owned:
            raise MeshStartError("invalid_up_args", f"the bench picks {' and '.join(OWNED_FLAGS)} of each fresh "
                                                    f"mesh itself; leave out {', '.join(owned)}")

    def command(self, port: int, state_dir: Path) -> list[str]:
        return [sys.executable, "-m", "services.cli", "up", "--port", str(port), "--state-dir", str(state_dir),
                *self.up_args]

    @contextlib.asynccontextmanager
    async def running(self, name: str) -> AsyncIterator[FreshMesh]:
        """A new mesh for the body's duration."""
        with tempfile.TemporaryDirectory(prefix=f"voxmesh-bench-{name}-") as state:
            process = await asyncio.create_subprocess_exec(
                *self.command(free_port(), Path(state)), cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            serving: asyncio.Future[FreshMesh | None] = asyncio.get_running_loop().create_future()
            tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
            log_path = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_path = self.log_dir / f"{name}.log"
            reader = asyncio.create_task(_read_output(process, serving, tail, log_path))
            try:
                yield await self._wait_serving(serving, tail)
            finally:
                await _stop(process)
                await reader

    async def _wait_serving(self, serving: asyncio.Future[FreshMesh | None], tail: Sequence[str]) -> FreshMesh:
        try:
            mesh = await asyncio.wait_for(asyncio.shield(serving), self.start_timeout_s)
        except TimeoutError:
            raise MeshStartError("mesh_failed", f"voxmesh up was not serving within {self.start_timeout_s:.0f} s:\n"
                                                + "\n".join(tail)) from None
        if mesh is None:
            raise MeshStartError("mesh_failed", "voxmesh up ended before serving:\n" + "\n".join(tail))
        return mesh


async def _read_output(process: asyncio.subprocess.Process, serving: asyncio.Future[FreshMesh | None],
                       tail: collections.deque[str], log_path: Path | None) -> None:
    """Drain the mesh's output (a full pipe would stall it); resolve `serving` with the mesh, or None when the
    output ends first."""
    with contextlib.ExitStack() as stack:
        log = None if log_path is None else stack.enter_context(log_path.open("w"))
        async for raw in process.stdout:
            line = raw.decode(errors="replace")
            tail.append(line.rstrip())
            if log is not None:
                log.write(line)
            if not serving.done() and (match := SERVING.search(line)):
                serving.set_result(FreshMesh(match.group(1), observer_events_url(line)))
    if not serving.done():
        serving.set_result(None)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
