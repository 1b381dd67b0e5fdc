"""SIGUSR1 opens a profiler window in a serving process when the `device_trace_dir` setting asks for one, and only
then."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal

import torch

from services.runtime import device_trace


async def test_sigusr1_writes_a_trace_of_what_ran_in_the_window(tmp_path):
    window = device_trace.install("decode", str(tmp_path), 0.3)
    assert window is not None
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        while not window.written.is_set():  # ops run in the window until the trace is written
            torch.ones(64, 64).matmul(torch.ones(64, 64))
            await asyncio.sleep(0.01)
        with gzip.open(window.path, "rt") as trace:
            events = json.load(trace)["traceEvents"]
        assert window.path.name == f"decode-{os.getpid()}.json.gz"
        assert any("mm" in str(event.get("name", "")) for event in events), "the matmuls of the window are missing"
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)


async def test_without_the_setting_the_signal_is_not_taken():
    assert device_trace.install("decode", None, 5.0) is None
    assert not asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
