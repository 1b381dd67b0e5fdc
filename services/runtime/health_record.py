"""Which micro service instances this process runs, on disk, so a container's healthcheck asks its own.

`$SRV.PING.voxmesh-decode` is answered by every decode replica on the bus; a healthcheck must ask the one in its own
container. Each service's lifecycle writes `<health dir>/<micro name>.json` (its instance id and replica) once it
answers discovery, and removes it when it stops; `voxmesh health` pings `$SRV.PING.<name>.<id>` for each file. A
restarted process overwrites its predecessor's file, so a stale id never outlives the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class HealthRecord:
    """One serving micro service instance of this process."""

    name: str  # the micro service's name, e.g. voxmesh-decode
    instance_id: str
    replica: str


@contextlib.contextmanager
def health_record(directory: str | Path, name: str, instance_id: str, replica: str) -> Iterator[None]:
    """Record the instance while the block runs (written atomically: a healthcheck never reads half a file)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}{SUFFIX}"
    partial = folder / f".{name}.{os.getpid()}.partial"
    partial.write_text(json.dumps({"name": name, "id": instance_id, "replica": replica}), encoding="utf-8")
    os.replace(partial, path)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if json.loads(path.read_text(encoding="utf-8")).get("id") == instance_id:  # not a successor's
                path.unlink()


def read_records(directory: str | Path) -> list[HealthRecord]:
    """Every instance recorded in `directory` (none when it does not exist)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    records = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        data = json.loads(path.read_text(encoding="utf-8"))
        records.append(HealthRecord(name=data["name"], instance_id=data["id"], replica=data["replica"]))
    return records
