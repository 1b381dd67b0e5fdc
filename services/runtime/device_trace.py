"""A window of torch's profiler in a serving process, opened by SIGUSR1: what the device ran, under real load.

py-spy says where a process's threads are; it cannot say what the GPU did meanwhile, or how two processes sharing
one card took turns on it. With the `device_trace_dir` setting given, SIGUSR1 records every kernel and CPU op of this
process for `device_trace_s` seconds and writes `<dir>/<service>-<pid>.json.gz`, a Chrome trace whose timestamps are
on one clock for every process of the machine (`loadtest/gpu/device_trace_summary.py` reads several together). The
export runs off the event loop. Without the setting the signal is not handled, so nothing changes for a process
nobody asked to trace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)


def install(service: str, folder: str | None, seconds: float) -> TraceWindow | None:
    """Handle SIGUSR1 in the running loop when a trace `folder` is given (the `device_trace_dir` setting; None: the
    signal is left alone), each window `seconds` long (`device_trace_s`)."""
    if not folder:
        return None
    window = TraceWindow(Path(folder) / f"{service}-{os.getpid()}.json.gz", seconds)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, window.open)
    log.info("SIGUSR1 records %.1f s of torch profiler trace into %s", seconds, window.path)
    return window


class TraceWindow:
    """One profiler window at a time; a signal during a window is ignored. `written` is set once a trace is on disk."""

    def __init__(self, path: Path, seconds: float) -> None:
        self.path, self.seconds = path, seconds
        self.written = asyncio.Event()
        self._task: asyncio.Task | None = None

    def open(self) -> None:
        if self._task is not None and not self._task.done():
            log.warning("a device trace is already being recorded; SIGUSR1 ignored")
            return
        self._task = asyncio.get_running_loop().create_task(self._record())

    async def _record(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        profiler = profile(activities=activities)
        loop = asyncio.get_running_loop()
        # Started and stopped on the loop's thread: the profiler must stop on the thread that started it, and it
        # records CPU ops of that thread only (the device's kernels it records from every thread). Stopping flushes
        # the device's activity buffers, a blocking pause of the loop once per window; the export runs beside it.
        profiler.start()
        log.info("device trace: recording %.1f s", self.seconds)
        try:
            await asyncio.sleep(self.seconds)  # the window's length is the point here, not a synchronisation
        finally:
            profiler.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        await loop.run_in_executor(None, profiler.export_chrome_trace, str(self.path))
        log.info("device trace written to %s", self.path)
        self.written.set()
