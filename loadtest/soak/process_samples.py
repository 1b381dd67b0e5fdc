"""Resident memory, file descriptors and threads of the mesh's processes, read from /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process at one moment.

    Attributes:
        name: what it is in the mesh: up (the `voxmesh up` supervisor), nats-server, gateway, decode, vocoder.
        pid: its process id.
        rss_bytes: resident memory.
        fds: open file descriptors.
        threads: threads.
    """

    name: str
    pid: int
    rss_bytes: int
    fds: int
    threads: int

    def to_dict(self) -> dict:
        return asdict(self)


def mesh_processes(root_pid: int) -> dict[str, int]:
    """Name -> pid of `root_pid` (the `voxmesh up` process) and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent_pid(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: dict[str, int] = {}
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        found[_role(pid) if pid != root_pid else "up"] = pid
        todo += children.get(pid, [])
    return found


def sample_process(name: str, pid: int) -> ProcessSample:
    """`pid` now; OSError when it is gone."""
    status = _status(pid)
    return ProcessSample(name=name, pid=pid, rss_bytes=int(status["VmRSS"].split()[0]) * 1024,
                         fds=len(os.listdir(PROC / str(pid) / "fd")), threads=int(status["Threads"]))


def _status(pid: int) -> dict[str, str]:
    lines = (PROC / str(pid) / "status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _parent_pid(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:  # gone meanwhile
        return None
    # The command name (field 2) is in parentheses and may hold spaces; the parent pid is the 2nd field after it.
    return int(stat.rpartition(")")[2].split()[1])


def _role(pid: int) -> str:
    """nats-server, or the service a `voxmesh serve NAME` child runs, or the command's first word."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return f"pid-{pid}"
    if argv and argv[0].endswith("nats-server"):
        return "nats-server"
    if "serve" in argv and argv.index("serve") + 1 < len(argv):
        return argv[argv.index("serve") + 1]
    return f"{Path(argv[0]).name}-{pid}"
