"""The one service lifecycle, against a real nats-server: discovery, endpoints, the lease, the stop order, and a task
that dies stopping its service cleanly."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from contextlib import AsyncExitStack

import nats.errors
import pytest
from nats.micro.request import Request
from nats.micro.service import ServiceVerb, control_subject

from messages.streams import BusConfig
from services.bus import read_lease
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.runtime.common_settings import CommonSettings
from services.runtime.lifecycle import (Endpoint, ServiceContext, ServiceFailed, ServiceParts, ServiceTask,
                                        run_service)
from services.runtime.process import EXIT_FAILED, run_until_signal
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny",), num_partitions=1)
TIMEOUT_S = 10.0
SERVICE = "probe"
MICRO = "voxmesh-probe"
REPLICA = "probe-a"


def settings_of(nats_server) -> CommonSettings:
    return CommonSettings(nats_url=nats_server.url, replica=REPLICA)


def until(name: str, seen: list[str]) -> ServiceTask:
    """A task that records that it was told to return."""

    async def run(told: asyncio.Event) -> None:
        await told.wait()
        seen.append(name)

    return ServiceTask(name, run)


async def start(nats_server, build, stop: asyncio.Event) -> asyncio.Task:
    """Run the service until `started`; a service that ends first raises its error here."""
    started = asyncio.Event()
    service = asyncio.create_task(run_service(settings_of(nats_server), SERVICE, build, stop, started=started))
    waiter = asyncio.ensure_future(started.wait())
    done, _ = await asyncio.wait([waiter, service], timeout=TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        service.result()
        raise AssertionError("the service did not start")
    return service


async def test_a_service_answers_srv_and_its_endpoints_while_leased(nats_server, nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    stop = asyncio.Event()

    async def echo(request: Request) -> None:
        await request.respond(b"echo:" + request.data)

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        return ServiceParts(description="a probe", stats=lambda: {"probes": 7}, metadata={"model": "tiny"},
                            endpoints=[Endpoint("echo", "test.lifecycle.echo", echo)],
                            tasks=[until("front", [])])

    service = await start(nats_server, build, stop)
    try:
        assert (await nats_client.request("test.lifecycle.echo", b"hi", TIMEOUT_S)).data == b"echo:hi"
        ping = json.loads((await nats_client.request(control_subject(ServiceVerb.PING, MICRO), b"", TIMEOUT_S)).data)
        info = json.loads((await nats_client.request(control_subject(ServiceVerb.INFO, MICRO), b"", TIMEOUT_S)).data)
        stats = json.loads((await nats_client.request(control_subject(ServiceVerb.STATS, MICRO), b"",
                                                      TIMEOUT_S)).data)
        lease = await read_lease(kv, REPLICA)
    finally:
        stop.set()
        await asyncio.wait_for(service, TIMEOUT_S)
    assert ping["name"] == MICRO
    assert info["description"] == "a probe" and info["metadata"] == {"replica": REPLICA, "model": "tiny"}
    assert [(e["name"], e["subject"]) for e in info["endpoints"]] == [("echo", "test.lifecycle.echo")]
    assert stats["endpoints"][0]["data"] == {"probes": 7} and stats["endpoints"][0]["num_requests"] == 1
    assert (lease.replica, lease.service) == (REPLICA, SERVICE)
    assert await read_lease(kv, REPLICA) is None  # released on the way out


async def test_stop_leaves_discovery_then_drains_then_releases_the_lease(nats_server, nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    stop = asyncio.Event()
    seen: list[str] = []
    connections = []

    async def drain() -> None:
        with pytest.raises(nats.errors.NoRespondersError):  # discovery left first
            await nats_client.request(control_subject(ServiceVerb.PING, MICRO), b"", TIMEOUT_S)
        seen.append(f"drain (leased: {await read_lease(kv, REPLICA) is not None})")

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        connections.append(context.nc)
        return ServiceParts(description="a probe", tasks=[until("front", seen)],
                            background=[until("background", seen)], drain=drain)

    service = await start(nats_server, build, stop)
    stop.set()
    await asyncio.wait_for(service, TIMEOUT_S)
    assert seen == ["front", "drain (leased: True)", "background"]
    assert await read_lease(kv, REPLICA) is None and connections[0].is_closed


@pytest.mark.parametrize("kind", ["tasks", "background"])
async def test_a_task_that_dies_stops_the_service_cleanly(nats_server, nats_client, caplog, kind) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)
    stop = asyncio.Event()
    seen: list[str] = []

    async def dies(_told: asyncio.Event) -> None:
        raise RuntimeError("boom")

    async def drain() -> None:
        seen.append("drain")

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        return ServiceParts(description="a probe", drain=drain, grace_s=TIMEOUT_S,
                            tasks=[until("front", seen)] + ([ServiceTask("dies", dies)] if kind == "tasks" else []),
                            background=[until("background", seen)]
                            + ([ServiceTask("dies", dies)] if kind == "background" else []))

    caplog.set_level(logging.ERROR, logger="services.runtime")
    with pytest.raises(ServiceFailed, match="boom"):
        await asyncio.wait_for(run_service(settings_of(nats_server), SERVICE, build, stop), TIMEOUT_S)
    assert stop.is_set() and seen == ["front", "drain", "background"]  # the others got their grace, in order
    assert await read_lease(kv, REPLICA) is None
    died = [r for r in caplog.records if "task dies died" in r.getMessage()]
    assert died and died[0].exc_info is not None  # logged why, with the traceback


async def test_a_task_that_returns_unasked_stops_the_service(nats_server, nats_client) -> None:
    kv = await fresh_bus(nats_client.jetstream(), CONFIG)

    async def returns(_told: asyncio.Event) -> None:
        return

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        return ServiceParts(description="a probe", background=[ServiceTask("quitter", returns)])

    with pytest.raises(ServiceFailed, match="quitter returned"):
        await asyncio.wait_for(run_service(settings_of(nats_server), SERVICE, build, asyncio.Event()), TIMEOUT_S)
    assert await read_lease(kv, REPLICA) is None


async def test_a_failed_service_exits_non_zero_and_sigterm_stops_a_service(nats_server, nats_client) -> None:
    await fresh_bus(nats_client.jetstream(), CONFIG)

    async def fails(_told: asyncio.Event) -> None:
        raise RuntimeError("boom")

    async def signals(told: asyncio.Event) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the loop: sets the stop event
        await told.wait()

    def serve_with(task: ServiceTask):
        async def serve(settings: CommonSettings, stop: asyncio.Event) -> None:
            async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
                return ServiceParts(description="a probe", tasks=[task])

            await run_service(settings, SERVICE, build, stop)

        return serve

    settings = settings_of(nats_server)
    assert await asyncio.wait_for(run_until_signal(serve_with(ServiceTask("fails", fails)), settings),
                                  TIMEOUT_S) == EXIT_FAILED
    assert await asyncio.wait_for(run_until_signal(serve_with(ServiceTask("signals", signals)), settings),
                                  TIMEOUT_S) == 0


async def test_a_stop_while_waiting_for_nats_ends_the_wait() -> None:
    stop = asyncio.Event()
    stop.set()

    async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
        raise AssertionError("never connected, never built")

    settings = CommonSettings(nats_url="nats://127.0.0.1:9", replica=REPLICA)  # nothing listens on port 9
    await asyncio.wait_for(run_service(settings, SERVICE, build, stop), TIMEOUT_S)


def test_services_run_on_uvloop_unless_told_otherwise_or_it_is_missing(monkeypatch, caplog) -> None:
    import uvloop

    from services.runtime.common_settings import CommonSettings
    from services.runtime.process import loop_factory

    assert CommonSettings().event_loop == "uvloop"
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed: importing it raises
    with caplog.at_level(logging.WARNING):
        assert loop_factory("uvloop") is None
    assert "uvloop is not installed here" in caplog.text


async def test_a_stop_while_the_server_is_gone_ends_the_service_without_an_error(tmp_path) -> None:
    """The bus went away (a server restarting, a partition) and then the service is told to stop: there is nothing
    to drain to, so it closes its connection and ends, instead of failing on a drain it cannot make."""
    seen: list[str] = []
    lost = asyncio.Event()
    with EmbeddedNats(tmp_path / "store", name="voxmesh-lost") as server:
        admin = await connect(server.url, "voxmesh-test-admin", initial_timeout_s=TIMEOUT_S)
        await fresh_bus(admin.jetstream(), CONFIG)
        await admin.close()
        stop = asyncio.Event()

        async def build(context: ServiceContext, _stack: AsyncExitStack) -> ServiceParts:
            context.nc._disconnected_cb = _also_setting(lost, context.nc._disconnected_cb)  # nats-py's own hook
            return ServiceParts(description="a probe", tasks=[until("front", seen)])

        service = await start(server, build, stop)
        server.kill()
        await asyncio.wait_for(lost.wait(), TIMEOUT_S)
        stop.set()
        await asyncio.wait_for(service, TIMEOUT_S)  # raises what the service raised
    assert seen == ["front"]


def _also_setting(event: asyncio.Event, callback):
    """`callback`, which also sets `event` when called."""

    async def called() -> None:
        event.set()
        if callback is not None:
            await callback()

    return called
