"""JetStream encryption at rest: with the key `voxmesh up` gives its embedded server, a stored message's text is in
no file of the store; without it (the control) it is there in clear."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.js import api

from messages import subjects
from services.bus.embedded import EmbeddedNats
from services.bus.store_key import encryption_block, ensure_store_key

TEXT = b"Penguins audit the velvet observatory."


async def _store_one_text(server: EmbeddedNats) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(api.StreamConfig(name="KEPT", subjects=[subjects.all_requests()],
                                             storage=api.StorageType.FILE))
        await js.publish(subjects.request("tiny"), TEXT)
    finally:
        await nc.close()


def _files_with_text(store: Path) -> list[Path]:
    return [path for path in store.rglob("*") if path.is_file() and TEXT in path.read_bytes()]


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_stored_text_is_in_clear_only_without_the_key(tmp_path, encrypted):
    config = tmp_path / "server.conf"
    key = ensure_store_key(tmp_path / "store.key")
    config.write_text(encryption_block(key) if encrypted else "")
    server = EmbeddedNats(tmp_path / "store", config_file=config)
    async with server:
        await _store_one_text(server)
        found = _files_with_text(tmp_path / "store")
    assert bool(found) is not encrypted, found


def test_the_key_is_made_once_and_kept_private(tmp_path):
    path = tmp_path / "store.key"
    first = ensure_store_key(path)
    assert ensure_store_key(path) == first and len(first) >= 32
    assert path.stat().st_mode & 0o077 == 0
