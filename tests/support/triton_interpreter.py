"""Running a Triton kernel check on the CPU: Triton picks its interpreter when it is imported, and the rest of the
suite imports it without, so the checks run in one other process with TRITON_INTERPRET=1, started at the first
check and shared by every later one of the session (`tests/support/triton_interpreter_worker.py`): one start-up and one
import of torch and Triton instead of one a check."""

from __future__ import annotations

import ast
import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

CALL_TIMEOUT_S = 300
WORKER = Path(__file__).with_name("triton_interpreter_worker.py")


class _Worker:
    """The session's interpreter process: one call a line on its stdin, one JSON reply a line on its stdout."""

    def __init__(self) -> None:
        root = str(WORKER.parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nothing here has to drain it
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}, text=True, bufsize=1)

    def call(self, call: str) -> dict[str, str]:
        self.process.stdin.write(json.dumps(call) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], CALL_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:  # it died or hung: the next call starts a fresh one
            self.close()
            error = "" if ready else f"no reply within {CALL_TIMEOUT_S} s; "
            self.log.seek(0)
            return {"error": f"{error}the interpreter process ended: {self.log.read()[-3000:]}"}
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


_worker: _Worker | None = None


def _close() -> None:
    if _worker is not None:
        _worker.close()


atexit.register(_close)


def interpreted(call: str) -> object:
    """The value of `call` (a Python expression over the repository's modules, e.g. `tests.x.compare('cpu')`, whose
    result is a literal) evaluated in the session's process with Triton's interpreter on."""
    global _worker
    if _worker is None or _worker.process.poll() is not None:
        _worker = _Worker()
    reply = _worker.call(call)
    assert "value" in reply, reply.get("error", reply)
    return ast.literal_eval(reply["value"])
