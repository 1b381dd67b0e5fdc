"""`voxmesh up --cuda-mps`: a CUDA MPS control daemon of the mesh's own, its pipe folder under the state dir, stopped
with the mesh; refused clearly where it cannot work.

This machine has no NVIDIA driver, so the daemon here is a stand-in program of the same name on PATH that does what
the tests look at: `-d` opens `$CUDA_MPS_PIPE_DIRECTORY/control` (or fails, when told to), and a command on stdin is
recorded with the pipe folder it was sent to. The real daemon ran on the GPU machine (loadtest/RESULTS-GPU.md).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from services.mesh import cuda_mps
from services.mesh.cuda_mps import CONTROL_PROGRAM, CudaMps, CudaMpsError

STAND_IN = """#!{python}
import os, sys
from pathlib import Path
pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
record = Path({record!r})
if sys.argv[1:] == ["-d"]:
    if os.environ.get("STAND_IN_FAILS"):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(3)
    with record.open("a") as out:
        out.write(f"daemon {{pipe}} log {{os.environ['CUDA_MPS_LOG_DIRECTORY']}}\\n")
    if not os.environ.get("STAND_IN_SILENT"):
        (pipe / "control").touch()
else:
    command = sys.stdin.read().strip()
    with record.open("a") as out:
        out.write(f"{{command}} {{pipe}}\\n")
    if command == "quit":
        (pipe / "control").unlink(missing_ok=True)
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    """The stand-in control program first on PATH; returns the file it records its calls in."""
    bin_dir, record = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    program = bin_dir / CONTROL_PROGRAM
    program.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_the_daemon_listens_on_the_state_dirs_pipe_folder_and_quits_once(stand_in, tmp_path):
    state = tmp_path / "state"
    daemon = CudaMps.start(state)
    pipe, log = state / "cuda-mps" / "pipe", state / "cuda-mps" / "log"
    assert (pipe / "control").exists(), "start returns once the daemon listens"
    assert daemon.environment() == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    daemon.stop()
    daemon.stop()
    assert stand_in.read_text().splitlines() == [f"daemon {pipe} log {log}", f"quit {pipe}"]
    assert not (pipe / "control").exists()


def test_a_daemon_left_by_a_killed_mesh_is_quit_before_a_new_one_starts(stand_in, tmp_path):
    pipe = tmp_path / "state" / "cuda-mps" / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").touch()  # what a daemon left running by a mesh killed outright leaves in the folder
    daemon = CudaMps.start(tmp_path / "state")
    daemon.stop()
    calls = stand_in.read_text().splitlines()
    assert calls[0] == f"quit {pipe}" and calls[1].startswith(f"daemon {pipe}") and calls[2] == f"quit {pipe}"


def test_a_missing_program_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CudaMpsError, match=f"--cuda-mps needs {CONTROL_PROGRAM} on PATH"):
        CudaMps.start(tmp_path / "state")


def test_a_daemon_that_fails_to_start_says_why(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_FAILS", "1")
    with pytest.raises(CudaMpsError, match="exited with 3: An instance of this daemon is already running"):
        CudaMps.start(tmp_path / "state")


def test_a_daemon_that_never_listens_is_told_to_quit(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_SILENT", "1")
    monkeypatch.setattr(cuda_mps, "READY_TIMEOUT_S", 0.3)
    with pytest.raises(CudaMpsError, match="did not open .*control within"):
        CudaMps.start(tmp_path / "state")
    assert stand_in.read_text().splitlines()[-1].startswith("quit ")


def _up(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", "up", "--state-dir", str(tmp_path / "state"),
                           *flags], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def test_up_refuses_mps_without_a_cuda_device_before_starting_anything(tmp_path):
    done = _up(tmp_path, "--cuda-mps")
    assert done.returncode == 2 and "--cuda-mps shares a CUDA card" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists(), "nothing may start, not even the state dir"


def test_up_without_the_program_stops_before_the_bus_naming_it(tiny_checkpoint, tmp_path):
    done = _up(tmp_path, "--model", str(tiny_checkpoint), "--device", "cuda", "--cuda-mps",
               env={"PATH": os.path.dirname(sys.executable)})
    assert done.returncode == 1, done.stderr
    assert f"--cuda-mps needs {CONTROL_PROGRAM} on PATH" in done.stderr
    assert "voxmesh is serving" not in done.stdout and not (tmp_path / "state" / "nats-auth").exists()
