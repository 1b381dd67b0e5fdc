"""A service's connection (`connect_service`, given every member's URL as `--nats-url` is) carries on when its
server is killed: it reconnects to another member, and its submits, claims (compare-and-set on the bucket) and the reads fencing rests on go on."""

from __future__ import annotations

import asyncio
import time

from messages import SynthesisRequest
from messages.streams import REQUESTS_STREAM, BusConfig
from services.bus import provision, submit_request
from services.bus.claims import claim_request, read_owner
from services.bus.provision import open_bucket
from services.runtime.common_settings import CommonSettings
from services.runtime.nats_connect import connect_service
from tests.support.nats_cluster import ELECTION_TIMEOUT_S

CONFIG = BusConfig(models=("tiny",), num_partitions=1, stream_replicas=3)


async def test_a_service_connection_moves_to_another_member_when_its_server_dies(nats_cluster,
                                                                                 cluster_client) -> None:
    await provision(cluster_client.jetstream(), CONFIG)
    reconnected = asyncio.Event()
    nc = await connect_service(CommonSettings(nats_url=",".join(nats_cluster.urls)), "voxmesh-test-service")
    nc._reconnected_cb = _chain(nc._reconnected_cb, reconnected)  # noqa: SLF001 - observe the event the helper logs
    try:
        js = nc.jetstream()
        kv = await open_bucket(js)
        await submit_request(js, SynthesisRequest(id="before", model="tiny", text="Before.", seed=1))
        first = nc.connected_url.port
        victim = next(i for i, url in enumerate(nats_cluster.urls) if url.endswith(f":{first}"))
        started = time.monotonic()
        nats_cluster.kill(victim)
        await asyncio.wait_for(reconnected.wait(), ELECTION_TIMEOUT_S)
        assert nc.connected_url.port != first
        await submit_request(js, SynthesisRequest(id="after", model="tiny", text="After.", seed=2))
        claim = await claim_request(kv, "after", "decode-after")
        assert await read_owner(kv, "after") == claim
        assert time.monotonic() - started < ELECTION_TIMEOUT_S
        assert (await js.stream_info(REQUESTS_STREAM)).state.messages == 2
    finally:
        await nc.close()
        await asyncio.to_thread(nats_cluster.restart, victim)
        await nats_cluster.wait_for_jetstream()


def _chain(callback, event: asyncio.Event):
    async def on_reconnect() -> None:
        if callback is not None:
            await callback()
        event.set()

    return on_reconnect
