"""A CUDA MPS control daemon of the mesh's own, for `voxmesh up --cuda-mps`.

Without MPS the processes that share a card (decode, the vocoder) each hold a CUDA context, and the card runs one
context at a time: decode's many small kernels and the codec's convolutions take turns. Under MPS their kernels go to
one server and run side by side. The daemon listens on a pipe folder of this mesh's own (under the state dir), so only
the processes given `environment()` become its clients, any other MPS daemon on the host is left alone, and stopping
the mesh stops this daemon (`quit`: the server exits once its last client has).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from services.mesh.processes import child_environment

log = logging.getLogger(__name__)

CONTROL_PROGRAM = "nvidia-cuda-mps-control"
"""The NVIDIA driver's MPS control program (started with -d it daemonizes; without, it reads commands on stdin)."""

READY_TIMEOUT_S = 10.0
"""The longest wait for the daemon's control pipe after `-d` returned."""

QUIT_TIMEOUT_S = 10.0
"""The longest a `quit` may take to be accepted."""


class CudaMpsError(RuntimeError):
    """The daemon could not be started (the program is missing, or it failed or never listened)."""


class CudaMps:
    """One MPS control daemon on `pipe_dir`, its logs in `log_dir`, from `start()` until `stop()`."""

    def __init__(self, control: str, pipe_dir: Path, log_dir: Path) -> None:
        self.control = control
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.is_running = True

    @classmethod
    def start(cls, state_dir: Path, *, control: str = CONTROL_PROGRAM) -> CudaMps:
        """Start the daemon with its pipe and log folders in `state_dir/cuda-mps/`, and wait until it listens."""
        program = shutil.which(control)
        if program is None:
            raise CudaMpsError(f"--cuda-mps needs {control} on PATH (it comes with the NVIDIA driver's utilities)")
        pipe_dir, log_dir = state_dir / "cuda-mps" / "pipe", state_dir / "cuda-mps" / "log"
        pipe_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        daemon = cls(program, pipe_dir, log_dir)
        if (pipe_dir / "control").exists():
            # The state dir's lock says no live mesh owns this folder: a daemon here was left by a mesh that was
            # killed outright (a daemon outlives its parent); it would refuse a second -d on the same pipe.
            log.warning("quitting the MPS control daemon an earlier mesh left on %s", pipe_dir)
            daemon._quit()
            _wait_until(lambda: not (pipe_dir / "control").exists(), QUIT_TIMEOUT_S)
        done = subprocess.run([program, "-d"], env=daemon._control_env(), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=READY_TIMEOUT_S)
        if done.returncode != 0:
            raise CudaMpsError(f"{control} -d exited with {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip() or 'no output'} (its log: {log_dir})")
        # -d returns once it has forked; the daemon opens its control pipe just after (no event to await here).
        if not _wait_until((pipe_dir / "control").exists, READY_TIMEOUT_S):
            daemon.stop()
            raise CudaMpsError(f"the MPS control daemon did not open {pipe_dir / 'control'} within "
                               f"{READY_TIMEOUT_S:.0f}s (its log: {log_dir})")
        return daemon

    def environment(self) -> dict[str, str]:
        """What makes a process this daemon's client (and no other's)."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def stop(self) -> None:
        """Tell the daemon to quit (idempotent; call it after the clients have stopped)."""
        if self.is_running:
            self.is_running = False
            self._quit()

    def _quit(self) -> None:
        try:
            subprocess.run([self.control], input="quit\n", env=self._control_env(), capture_output=True, text=True,
                           timeout=QUIT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            log.warning("the MPS control daemon on %s did not take `quit` within %.0fs", self.pipe_dir,
                        QUIT_TIMEOUT_S)

    def _control_env(self) -> dict[str, str]:
        return child_environment({}, self.environment())

    def describe(self) -> str:
        return f"CUDA MPS on {self.pipe_dir}"


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` every 50 ms for up to `timeout_s`: whether it came true (a daemon's pipe file has no event)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
