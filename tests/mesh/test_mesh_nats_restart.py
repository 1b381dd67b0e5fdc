"""The NATS server restarts (file storage, same port and store) while requests stream, under `voxmesh up --nats-url`
on the tiny CPU model: every service reconnects, each in-flight request ends exactly once (its audio complete and
equal to an undisturbed run, or one error after valid audio), and new requests succeed.

The restart is a clean stop (SIGTERM, as an operator's restart or a rolling upgrade does) followed by a start on the
same store, at once or after an outage longer than the lease ttl (every replica's lease has lapsed when the bus comes
back, so the supervisor may requeue a request its live owner still serves: the owner recognises its own claim). The
outage's length is the fault itself; everything else waits for events: the server's own readiness, the services'
"reconnected" log lines, the clients' end events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bus.embedded import EmbeddedNats
from tests.support.mesh import run_mesh
from tests.support.mesh_client import (FAULT_BODIES, WAIT_S, LiveStream, start_streams, stream_speech, terminal_count,
                               undisturbed_run)

LEASE_TTL_S = 3.0  # every service's default: an outage longer than this makes every replica look dead on return


class RestartableNats:
    """A nats-server of this module's own whose store, and port, outlive its restarts."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.server = EmbeddedNats(store)
        self.url = self.server.start()

    def restart(self, down_s: float) -> None:
        """Stop the server (SIGTERM: it flushes its store), keep it down `down_s` seconds (the fault's length, not a
        synchronisation), then start it again on the same port and store."""
        self.server.stop()
        time.sleep(down_s)
        self.server = EmbeddedNats(self.store, port=int(self.url.rsplit(":", 1)[1]))
        self.server.start()


@pytest.fixture(scope="module")
def nats_on_disk(tmp_path_factory) -> Iterator[RestartableNats]:
    nats = RestartableNats(tmp_path_factory.mktemp("nats-store"))
    yield nats
    nats.server.stop()


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory, nats_on_disk):
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("restart-mesh"), "--nats-url", nats_on_disk.url,
                  env={"VOXMESH_CODEC_BATCHING": "false"}) as running:
        yield running


@pytest.mark.parametrize("down_s", [0.0, LEASE_TTL_S + 1.0], ids=["quick-restart", "down-past-the-lease-ttl"])
async def test_in_flight_requests_end_once_and_new_ones_succeed_across_a_nats_restart(mesh, nats_on_disk, down_s):
    undisturbed = await asyncio.to_thread(undisturbed_run, mesh.gateway_url)
    lives, tasks = await start_streams(mesh.gateway_url, FAULT_BODIES)
    since = len(mesh.log)
    assert not any(task.done() for task in tasks), "the restart must meet requests in flight"
    await asyncio.to_thread(nats_on_disk.restart, down_s)
    results: list[LiveStream] = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    for service in ("gateway", "decode", "vocoder"):
        await asyncio.to_thread(mesh.wait_for_line, rf"voxmesh-{service}-\S+: NATS reconnected", since, WAIT_S)
    for live, reference in zip(results, undisturbed, strict=True):
        assert live.end.get("type") in ("audio.done", "error") and not live.closed, live.end
        if live.end["type"] == "audio.done":
            assert live.pcm == reference.pcm and len(live.frames) == live.end["chunk_count"]
        else:  # ended with an error after valid audio: a prefix of the undisturbed run's
            assert reference.pcm.startswith(live.pcm), live.end
        assert await terminal_count(nats_on_disk.url, live.request_id) == 1
    after = await stream_speech(mesh.gateway_url, {"input": "Back again.", "voice": "ryan", "max_new_tokens": 8})
    assert after.end["type"] == "audio.done", after.end
