"""The shared service skeleton and reconnection, against a real server."""

from __future__ import annotations

import asyncio
import json

from nats.micro.service import ServiceVerb, control_subject

from messages.streams import BusConfig
from services.bus import EmbeddedNats, Shutdown, connect, is_alive, read_lease
from services.bus.runtime import ServiceContext, run_service
from tests.fixtures.nats_server import fresh_bus

TIMEOUT_S = 10.0


async def test_a_service_registers_leases_serves_and_stops_clean(nats_server, nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), BusConfig(models=("tiny",), num_partitions=1))
    shutdown = Shutdown()
    seen: dict[str, object] = {}

    def workers(context: ServiceContext):
        async def probe(stop: asyncio.Event) -> None:
            seen["replica"] = context.replica
            reply = await context.nc.request(control_subject(ServiceVerb.PING, "voxmesh-decode"), b"", 5.0)
            seen["ping"] = json.loads(reply.data)["name"]
            lease_watch = await context.kv.watch("lease.decode-a")
            while (entry := await lease_watch.updates(TIMEOUT_S)) is None:
                pass
            seen["lease_while_running"] = await is_alive(context.kv, "decode-a")
            await lease_watch.stop()
            shutdown.request("probe done")
            await stop.wait()

        return [probe]

    await asyncio.wait_for(run_service(nats_server.url, service="decode", replica="decode-a", workers=workers,
                                       install_signals=False, shutdown=shutdown), TIMEOUT_S)
    assert seen == {"replica": "decode-a", "ping": "voxmesh-decode", "lease_while_running": True}
    assert await read_lease(kv, "decode-a") is None  # released on the way out


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
