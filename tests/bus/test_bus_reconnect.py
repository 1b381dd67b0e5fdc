"""Reconnection, against a real server that goes away and comes back."""

from __future__ import annotations

import asyncio

from services.bus import EmbeddedNats, connect

TIMEOUT_S = 10.0


async def test_a_client_reconnects_when_the_server_comes_back(tmp_path) -> None:
    server = EmbeddedNats(tmp_path / "store")
    url = await asyncio.to_thread(server.start)
    port = int(url.rsplit(":", 1)[1])
    nc = await connect(url, "reconnect-test")
    try:
        await asyncio.to_thread(server.stop)
        server = EmbeddedNats(tmp_path / "store", port=port)
        await asyncio.to_thread(server.start)
        sub = await nc.subscribe("probe")
        await nc.publish("probe", b"back")  # buffered until the reconnect, then delivered
        assert (await sub.next_msg(TIMEOUT_S)).data == b"back"
        assert nc.stats["reconnects"] >= 1
    finally:
        await nc.close()
        await asyncio.to_thread(server.stop)
