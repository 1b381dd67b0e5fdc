"""Running a Triton kernel check on the CPU: Triton picks its interpreter when it is imported, and the rest of the
suite imports it without, so a check runs in a fresh process with TRITON_INTERPRET=1."""

from __future__ import annotations

import ast
import os
import subprocess
import sys


def interpreted(call: str) -> object:
    """The value of `call` (a Python expression over the repository's modules, e.g. `tests.x.compare('cpu')`, whose
    result is a literal) evaluated in a fresh interpreter process with Triton's interpreter on."""
    module = call.split("(", 1)[0].rsplit(".", 1)[0]
    code = f"import {module}; print(repr({call}))"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])
