"""What a result file says about where and when it was measured: the commit, the cores and the load they carried."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The checkout's commit (with `+dirty` when the working tree has changes), or "unknown"."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine() -> dict[str, object]:
    """Cores, load averages now, the kernel and Python: the load is what other processes put on the same cores."""
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(), "python": platform.python_version()}


def stamp() -> dict[str, object]:
    """commit, date (UTC) and machine, for a result document's head."""
    return {"commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine()}
