"""Access and privacy on the whole mesh under `voxmesh up`: every service runs as its own NATS user without one
permission violation, a stranger is refused, the observer tails events, no log line holds a request's text or a
secret, and the stored streams are encrypted by default (no request text in their files)."""

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
from messages.streams import BUCKET
from tests.support.mesh import run_mesh
from tests.support.mesh_client import stream_speech

HTTP_TEXT = "Quiet zebras practise the oboe at dawn."
WS_TEXT = "Marmalade lighthouses never gossip."
SECRET_TEXTS = [HTTP_TEXT, WS_TEXT, "Quiet zebras", "Marmalade lighthouses"]


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("access-mesh")
    with run_mesh(tiny_checkpoint, state_dir) as running:  # the default configuration: the store encrypted
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
    assert len(secrets) == len(SERVICE_USERS) + 2  # each service's user, the operator's, and the resume secret
    log = list(mesh.log)
    assert not [line for line in log if "permissions violation" in line.lower()]
    assert not [line for line in log if any(text in line for text in SECRET_TEXTS)]
    assert not [line for line in log if any(secret in line for secret in secrets)]


@pytest.mark.parametrize("flags", [(), ("--no-encrypt-store",)], ids=["default", "in-clear-control"])
async def test_the_stored_streams_hold_no_request_text_in_clear_by_default(tiny_checkpoint, tmp_path, flags):
    """A mesh in its default configuration, after a request and with a text kept in its bucket (decode takes a
    request off REQUESTS at once: the kept text is what makes the check bite), read once stopped (the server has
    written everything): no file of the store holds either text. The control, `--no-encrypt-store`, holds the kept
    one in clear."""
    text, kept = "Penguins audit the velvet observatory.", "Velvet penguins keep the observatory's ledger."
    with run_mesh(tiny_checkpoint, tmp_path, *flags) as mesh:
        async with httpx.AsyncClient(base_url=mesh.gateway_url, timeout=60) as client:
            spoken = await client.post("/v1/audio/speech", json={"input": text, "voice": "ryan", "max_new_tokens": 4})
        assert spoken.status_code == 200, spoken.text
        nc = await nats.connect(mesh.nats_url)
        try:
            await (await nc.jetstream().key_value(BUCKET)).put("privacy-probe", kept.encode())
        finally:
            await nc.close()
    files = [path for path in (tmp_path / "nats").rglob("*") if path.is_file()]
    assert any(path.suffix == ".blk" for path in files), "the streams are stored in files"
    in_clear = {words for words in (text, "Penguins audit", kept) for path in files
                if words.encode() in path.read_bytes()}
    if flags:
        assert kept in in_clear
    else:
        assert not in_clear, f"stored in clear: {in_clear}"
        assert (tmp_path / "nats-store.key").stat().st_mode & 0o077 == 0


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
