"""`voxmesh up` as a user meets it: it serves, `voxmesh say` works against it, a full queue answers 429, Ctrl-C
stops every process it started, and a SIGKILL of it leaves none running either."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import wave
from pathlib import Path

import httpx

from messages.audio_format import SAMPLE_RATE
from tests.support.mesh import run_mesh
from tests.support.process_exit import exits


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line mentions `text` (the mesh's state dir appears in the nats-server's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"


def test_a_killed_up_leaves_neither_a_service_nor_its_nats_server_running(tiny_checkpoint, tmp_path):
    state = tmp_path / "state"
    with run_mesh(tiny_checkpoint, state) as mesh:
        started = [*mesh.pids.values(), *_processes_mentioning(str(state / "nats"))]
        assert len(started) == 4, f"three services and one nats-server: {started}"
        mesh.process.send_signal(signal.SIGKILL)
        mesh.process.wait()
        left = [pid for pid in started if not exits(pid, 30.0)]
        for pid in left:  # not to leave them to the next test
            os.kill(pid, signal.SIGKILL)
        assert left == [], f"still running after `voxmesh up` was killed: {left}"


def test_up_makes_its_model_serves_say_and_stops_leaving_no_process(tmp_path):
    state = tmp_path / "state"
    # No --model: the first run writes the tiny checkpoint. A dotted model name travels slugged in subjects.
    with run_mesh(None, state, "--model-name", "Qwen3-TTS-0.6B-demo") as mesh:
        assert (state / "models" / "tiny" / "config.json").is_file()
        children = dict(mesh.pids)
        assert set(children) == {"gateway", "decode", "vocoder"}
        assert _processes_mentioning(str(state)), "the embedded nats-server stores under the state dir"
        out = tmp_path / "said.wav"
        said = subprocess.run([sys.executable, "-m", "services.cli", "say", "Hello there.", "-o", str(out),
                               "--url", mesh.gateway_url,  # no --voice: the README's command
                               "--model", "Qwen3-TTS-0.6B-demo"], capture_output=True, text=True,
                              timeout=120)
        assert said.returncode == 0, said.stderr
        with wave.open(str(out)) as wav:
            assert wav.getframerate() == SAMPLE_RATE and wav.getnframes() > 0
        assert mesh.stop() == 0, mesh.log_tail()
    assert "voxmesh stopped" in mesh.log
    assert [pid for pid in children.values() if _alive(pid)] == []
    assert [pid for pid in _processes_mentioning(str(state)) if _alive(pid)] == []


async def test_full_request_queue_answers_429_with_retry_after(tiny_checkpoint, tmp_path):
    env = {"VOXMESH_MAX_QUEUED_REQUESTS": "1"}
    with run_mesh(tiny_checkpoint, tmp_path / "state", "--max-num-seqs", "1", env=env) as mesh:
        body = {"input": "Queue me up please.", "voice": "eric", "max_new_tokens": 40, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as client:
            responses = await asyncio.gather(*[client.post(f"{mesh.gateway_url}/v1/audio/speech", json=body)
                                               for _ in range(6)])
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 429 in statuses, statuses
    assert set(statuses) <= {200, 429}
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "queue_full"
