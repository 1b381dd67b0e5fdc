"""Access and privacy on the whole mesh under `voxmesh up`: every service runs as its own NATS user without one
permission violation, a stranger is refused, the observer tails events, no log line holds a request's text or a
secret, and the stored streams are encrypted (no request text in their files)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import httpx
import nats
import pytest

from messages.permissions import SERVICE_USERS
from tests.fixtures.mesh import run_mesh
from tests.mesh_client import stream_speech

HTTP_TEXT = "Quiet zebras practise the oboe at dawn."
WS_TEXT = "Marmalade lighthouses never gossip."
SECRET_TEXTS = [HTTP_TEXT, WS_TEXT, "Quiet zebras", "Marmalade lighthouses"]


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("access-mesh")
    with run_mesh(tiny_checkpoint, state_dir, "--encrypt-store") as running:
        running.state_dir = state_dir
        yield running


def bare(nats_url: str) -> str:
    """The URL without the operator's user and password the fixture put in it."""
    return re.sub(r"//[^@/]*@", "//", nats_url)


async def test_requests_run_with_no_violation_and_no_log_line_holds_their_text_or_a_secret(mesh):
    async with httpx.AsyncClient(base_url=mesh.gateway_url, timeout=60) as client:
        spoken = await client.post("/v1/audio/speech", json={"input": HTTP_TEXT, "voice": "ryan",
                                                             "max_new_tokens": 8})
    streamed = await stream_speech(mesh.gateway_url, {"input": WS_TEXT, "voice": "eric", "max_new_tokens": 8})
    assert spoken.status_code == 200 and streamed.end["type"] == "audio.done", streamed.end
    auth_dir = mesh.state_dir / "nats-auth"
    secrets = [path.read_text().strip() for path in auth_dir.glob("*.password")]
    secrets.append((mesh.state_dir / "resume.secret").read_text().strip())
    assert len(secrets) == len(SERVICE_USERS) + 2  # each service user's password, the operator's, the resume secret
    log = list(mesh.log)
    assert not [line for line in log if "permissions violation" in line.lower()]
    assert not [line for line in log if any(text in line for text in SECRET_TEXTS)]
    assert not [line for line in log if any(secret in line for secret in secrets)]


async def test_the_stored_streams_hold_no_request_text_in_clear(mesh):
    """The mesh's own store (`--encrypt-store`) after a request (decode takes a request off REQUESTS at once, so this
    alone would pass in clear too: tests/test_bus_store_encryption.py shows the key keeps a stored text out of the
    files)."""
    text = "Penguins audit the velvet observatory."
    streamed = await stream_speech(mesh.gateway_url, {"input": text, "voice": "ryan", "max_new_tokens": 4})
    assert streamed.end["type"] == "audio.done", streamed.end
    store = mesh.state_dir / "nats"
    files = [path for path in store.rglob("*") if path.is_file()]
    assert any(path.suffix == ".blk" for path in files), "the streams are stored in files"
    for words in (text, "Penguins audit"):
        assert not [path for path in files if words.encode() in path.read_bytes()], "stored in clear"
    assert (mesh.state_dir / "nats-store.key").stat().st_mode & 0o077 == 0


async def test_a_stranger_is_refused_and_the_observer_reads_a_requests_events(mesh):
    with pytest.raises(nats.errors.Error):
        await nats.connect(bare(mesh.nats_url), allow_reconnect=False, connect_timeout=5)
    streamed = await stream_speech(mesh.gateway_url, {"input": "Watch me.", "voice": "ryan", "max_new_tokens": 4})
    env = dict(os.environ, VOXMESH_NATS_USER="observer",
               VOXMESH_NATS_PASSWORD_FILE=str(mesh.state_dir / "nats-auth" / "observer.password"))
    tailed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "services.cli", "events", "--nats-url", bare(mesh.nats_url),
                         "--request", streamed.request_id], env=env, capture_output=True, text=True, timeout=60)
    assert tailed.returncode == 0, tailed.stderr
    assert "terminal" in tailed.stdout or "finished" in tailed.stdout, tailed.stdout
