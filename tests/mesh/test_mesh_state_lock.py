"""One `voxmesh up` per state directory: a second one on the same directory fails at once naming the running one
(never a NATS timeout), a lock left by a dead process is taken over, and two meshes with their own state
directories and ports serve side by side. Real `voxmesh up` processes, readiness from their own serving line."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from services.mesh.state_lock import LOCK_FILE
from tests.support.mesh import REPO, free_port, run_mesh

pytestmark = pytest.mark.timeout(300)

SECOND_UP_LIMIT_S = 30.0  # far below any NATS timeout path: it must refuse before starting anything


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def speak(url: str, text: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={"input": text, "response_format": "pcm"}, timeout=120)


def test_second_up_on_a_state_dir_fails_naming_the_first_and_others_run_beside(tiny_checkpoint, tmp_path):
    first_state, other_state = tmp_path / "first", tmp_path / "other"
    first_state.mkdir()
    (first_state / LOCK_FILE).write_text(f"pid {dead_pid()}, gateway http://127.0.0.1:1, since long ago\n")
    with run_mesh(tiny_checkpoint, first_state) as first, run_mesh(tiny_checkpoint, other_state) as other:
        assert first.gateway_url != other.gateway_url and first.nats_url != other.nats_url
        second = subprocess.run([sys.executable, "-m", "services.cli", "up", "--model", str(tiny_checkpoint),
                                 "--port", str(free_port()), "--state-dir", str(first_state)],
                                cwd=REPO, capture_output=True, text=True, timeout=SECOND_UP_LIMIT_S)
        assert second.returncode == 1, second.stderr
        assert f"in use by another voxmesh up (pid {first.process.pid}, gateway {first.gateway_url}" in second.stderr
        assert "--state-dir" in second.stderr and "Traceback" not in second.stderr
        assert (first_state / LOCK_FILE).read_text().startswith(f"pid {first.process.pid}, ")  # stale one taken over
        spoken = [speak(first.gateway_url, "First mesh."), speak(other.gateway_url, "Other mesh.")]
        assert [response.status_code for response in spoken] == [200, 200], [r.text for r in spoken]
        assert all(response.content for response in spoken)
        assert first.stop() == 0 and other.stop() == 0
    with run_mesh(tiny_checkpoint, first_state) as again:  # the exited holder's lock is free again
        assert speak(again.gateway_url, "Back again.").status_code == 200
