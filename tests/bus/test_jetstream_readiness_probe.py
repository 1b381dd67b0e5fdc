"""`wait_for_jetstream` past its budget says where each member's probe stood: ready, still connecting (a member
that never answers), or connected with JetStream not answering."""

from __future__ import annotations

import socket

import pytest

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.embedded_cluster import wait_for_jetstream
from services.bus.errors import NatsServerError

BUDGET_S = 3.0  # what the probe is given before it reports; the ready server answers well within it


async def _probe(url: str):
    return await connect(url, "readiness-probe", initial_timeout_s=None)


async def test_past_its_budget_the_probe_says_which_member_it_waited_on(tmp_path) -> None:
    with socket.socket() as silent, EmbeddedNats(tmp_path / "store") as server:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts; nothing ever sends INFO
        ready_url, silent_url = server.url, f"nats://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(NatsServerError) as failed:
            await wait_for_jetstream(_probe, [ready_url, silent_url], BUDGET_S)
    message = str(failed.value)
    assert f"{ready_url}: ready" in message, message
    assert f"{silent_url}: connecting" in message, message
