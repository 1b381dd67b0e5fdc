"""`voxmesh provision --write-nats-config DIR`, the compose files' nats-config step: a nats-server loaded with the
nats.conf it writes (as the compose files' `nats` service loads it) takes each service's user and password and
refuses a stranger, and stores the streams encrypted; a second run keeps every password and the store key, so a
running server's users still get in."""

from __future__ import annotations

import subprocess
import sys

import nats
import nats.errors
import pytest
from nats.js import api

from messages import subjects
from services.bus.embedded import EmbeddedNats
from services.bus.nats_auth import NatsAuth, users

TEXT = b"Harbour owls recite the tide tables."


def _write_config(directory) -> None:
    done = subprocess.run([sys.executable, "-m", "services.cli", "provision", "--write-nats-config", str(directory)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


async def test_the_written_configuration_has_the_users_and_encrypts_the_store(tmp_path):
    config = tmp_path / "config"
    _write_config(config)
    auth = NatsAuth(config)
    before = {user: auth.password(user) for user in users()}
    key = (config / "store.key").read_text()
    _write_config(config)  # the step runs again at every `docker compose up`
    assert {user: auth.password(user) for user in users()} == before and (config / "store.key").read_text() == key
    assert {path.stat().st_mode & 0o777 for path in config.iterdir()} == {0o600}
    async with EmbeddedNats(tmp_path / "store", config_file=config / "nats.conf") as server:
        with pytest.raises(nats.errors.Error):
            await nats.connect(server.url, allow_reconnect=False, connect_timeout=5)
        nc = await nats.connect(server.url, user="operator", password=before["operator"])
        try:
            await nc.jetstream().add_stream(api.StreamConfig(name="KEPT", subjects=[subjects.all_requests()]))
            await nc.jetstream().publish(subjects.request("tiny"), TEXT)
        finally:
            await nc.close()
        gateway = await nats.connect(server.url, user="gateway", password=before["gateway"])
        await gateway.close()
    assert not [path for path in (tmp_path / "store").rglob("*") if path.is_file() and TEXT in path.read_bytes()]
