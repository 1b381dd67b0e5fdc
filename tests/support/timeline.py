"""`pytest --timeline FILE`: when each test ran and on which worker, to see where a parallel run's wall time goes
(which worker ends last, and with which files). Every worker appends one JSON line per test (setup, call and
teardown together, so a module fixture's start is charged to the test that waited for it):
{"worker", "nodeid", "start", "end"} in wall-clock seconds.

`python -m tests.support.timeline FILE` prints each worker's span and busy time, and the files that ran last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeline", type=Path, default=None, metavar="FILE",
                     help="append when each test ran, and on which worker, to FILE (JSON lines)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = item.config.getoption("timeline")
    start = time.time()
    yield
    if path is not None:
        line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "nodeid": item.nodeid, "start": start,
                "end": time.time()}
        with open(path, "a", encoding="utf-8") as out:  # one short write per line: workers' lines do not mix
            out.write(json.dumps(line) + "\n")


def summary(lines: list[dict], last_files: int = 8) -> str:
    """Each worker's first start, last end and busy seconds; then the files whose last test ended last."""
    origin = min(line["start"] for line in lines)
    workers: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        workers[line["worker"]].append(line)
    rows = ["worker  from   to      busy   tests"]
    for worker, own in sorted(workers.items()):
        begin, end = min(t["start"] for t in own) - origin, max(t["end"] for t in own) - origin
        busy = sum(t["end"] - t["start"] for t in own)
        rows.append(f"{worker:<7} {begin:5.0f}  {end:6.0f}  {busy:6.0f}  {len(own)}")
    files: dict[str, tuple[float, float, str]] = {}
    for line in lines:
        name = line["nodeid"].split("::", 1)[0]
        first, last, worker = files.get(name, (line["start"], line["end"], line["worker"]))
        files[name] = (min(first, line["start"]), max(last, line["end"]), line["worker"])
    rows.append("files that ended last (start, end, worker):")
    for name, (first, last, worker) in sorted(files.items(), key=lambda kv: kv[1][1])[-last_files:]:
        rows.append(f"  {first - origin:6.0f} {last - origin:6.0f}  {worker}  {name}")
    return "\n".join(rows)


if __name__ == "__main__":
    text = Path(sys.argv[1]).read_text(encoding="utf-8")
    print(summary([json.loads(line) for line in text.splitlines() if line.strip()]))
