"""Fixtures of the gateway tests: a provisioned bus per test, the stand-in decode/vocoder, and the gateway under test
(in-process through httpx's ASGI transport, or under uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages.streams import BusConfig
from services.bus.connection import connect
from services.gateway.app import create_app
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.gateway import Gateway, build_gateway
from services.gateway.service import gateway_parts, http_task, serve
from services.gateway.settings import GatewaySettings
from services.random_checkpoint.model_presets import generation_config, preset_config
from services.runtime.lifecycle import ServiceContext, ServiceParts, run_service
from tests.support.gateway_standin import MODEL, NUM_PARTITIONS, Plan, StandInMesh
from tests.support.nats_server import fresh_bus

__all__ = ["bus_overrides", "gateway_app", "gateway_bus", "gateway_factory", "gateway_model_dir", "served_gateway",
           "standin", "watched_gateway"]

WS_PATH = "/v1/audio/speech/stream"


async def receive_until_event(socket, *kinds: str) -> tuple[bytes, dict]:
    """Collect binary frames until a JSON event of one of `kinds`; returns (pcm, event)."""
    pcm = bytearray()
    while True:
        message = await socket.recv()
        if isinstance(message, bytes):
            pcm += message
            continue
        event = json.loads(message)
        if event["type"] in kinds:
            return bytes(pcm), event
        assert event["type"] == "audio.start", event


@pytest.fixture(scope="session")
def gateway_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory with only the tiny preset's config files (the gateway reads no weights)."""
    directory = tmp_path_factory.mktemp("gateway-model")
    (directory / "config.json").write_text(json.dumps(preset_config(MODEL)))
    (directory / "generation_config.json").write_text(json.dumps(generation_config(MODEL)))
    return directory


@dataclass
class BusHandles:
    nc: Client
    js: JetStreamContext
    kv: KeyValue
    url: str
    config: BusConfig


@pytest.fixture
def bus_overrides() -> dict:
    """BusConfig fields a test module changes (override this fixture in the module)."""
    return {}


@pytest.fixture
async def gateway_bus(bus_overrides: dict, nats_server) -> AsyncIterator[BusHandles]:
    """Freshly provisioned streams and bucket for one test (BusConfig changed by `bus_overrides`)."""
    config = replace(BusConfig(models=(MODEL,), num_partitions=NUM_PARTITIONS, storage="memory",
                               request_ack_wait_s=5.0), **bus_overrides)
    nc = await connect(nats_server.url, "gateway-test-bus", initial_timeout_s=10.0)
    js = nc.jetstream()
    kv = await fresh_bus(js, config)
    try:
        yield BusHandles(nc, js, kv, nats_server.url, config)
    finally:
        await nc.close()


@pytest.fixture
async def standin(gateway_bus: BusHandles) -> AsyncIterator[StandInMesh]:
    """Live decode/vocoder replicas (leases, partitions, re-decode answers); call `start_consumer()` to serve."""
    nc = await connect(gateway_bus.url, "gateway-test-standin", initial_timeout_s=10.0)
    mesh = StandInMesh(nc, nc.jetstream(), await nc.jetstream().key_value(gateway_bus.config.bucket().name))
    await mesh.start_replicas()
    try:
        yield mesh
    finally:
        await mesh.stop()
        await nc.close()


TEST_RESUME_SECRET = "resume-secret-of-the-tests"  # every gateway of a test's mesh signs resume tokens with it


def gateway_settings(bus: BusHandles, default_model_dir: Path, **overrides) -> GatewaySettings:
    """Settings for a gateway under test: fast supervision, short grace periods (`model_dir` may be overridden)."""
    values = dict(nats_url=bus.url, model_dir=str(default_model_dir), model_name=MODEL, num_partitions=NUM_PARTITIONS,
                  replica="gateway-test", supervise_interval_s=0.05, vocoder_grace_s=0.5,
                  redecode_timeout_s=1.0, request_deadline_s=20.0, resume_window_s=0.2, drain_timeout_s=2.0,
                  resume_secret=TEST_RESUME_SECRET)
    values.update(overrides)
    return GatewaySettings(**values)


def gateway_settings_on_mesh(nats_url: str, model_dir: Path, **overrides) -> GatewaySettings:
    """Settings for a second gateway, in the test's process, beside a `voxmesh up` mesh's own (its NATS, its
    checkpoint, compose/single.yml's 4 partitions, a replica name of its own; pass `resume_secret` to verify the
    mesh's own gateway's resume tokens)."""
    values = dict(nats_url=nats_url, model_dir=str(model_dir), model_name=MODEL, num_partitions=4,
                  replica=f"gateway-test-{secrets.token_hex(4)}", supervise_interval_s=0.05, drain_timeout_s=2.0)
    return GatewaySettings(**{**values, **overrides})


@contextlib.asynccontextmanager
async def gateway_service(settings: GatewaySettings,
                          listener: socket.socket | None = None) -> AsyncIterator[tuple[Gateway, FastAPI]]:
    """The real gateway service (NATS connected, `$SRV` answering, lease and supervisor running), serving HTTP on
    `listener` when one is given; yields its running parts and its app, so a test can watch the gateway's state.
    Stopped through its `stop` event; a service that dies raises here."""
    catalog = VoiceCatalog.from_dir(settings.model_dir, settings.model_name)
    built: list[tuple[Gateway, FastAPI]] = []

    async def build(context: ServiceContext, _stack: contextlib.AsyncExitStack) -> ServiceParts:
        gateway = await build_gateway(settings, catalog, context)
        app = create_app(gateway)
        built.append((gateway, app))
        tasks = [] if listener is None else [http_task(app, settings, [listener])]
        return gateway_parts(settings, gateway, tasks=tasks)

    stop, started = asyncio.Event(), asyncio.Event()
    service = asyncio.create_task(run_service(settings, "gateway", build, stop, started=started))
    try:
        await until_started(started, service)
        yield built[0]
    finally:
        stop.set()
        await service


@contextlib.asynccontextmanager
async def gateway_app(settings: GatewaySettings) -> AsyncIterator[FastAPI]:
    """The real gateway service without its HTTP server; yields its app for an in-process client."""
    async with gateway_service(settings) as (_gateway, app):
        yield app


async def until_started(started: asyncio.Event, service: asyncio.Task) -> None:
    """Until the service is serving; a service that ends first raises its error here."""
    waiter = asyncio.ensure_future(started.wait())
    done, _ = await asyncio.wait([waiter, service], return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        service.result()
        raise AssertionError("the gateway service returned before serving")


@pytest.fixture
def gateway_factory(gateway_bus: BusHandles, gateway_model_dir: Path):
    """`async with gateway_factory(**settings) as client:` an httpx client of a running gateway app (NATS
    connected, supervisor running)."""

    @contextlib.asynccontextmanager
    async def start(**overrides) -> AsyncIterator[httpx.AsyncClient]:
        async with gateway_app(gateway_settings(gateway_bus, gateway_model_dir, **overrides)) as app:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30.0) as client:
                yield client

    return start


@dataclass
class WatchedGateway:
    """A gateway under uvicorn whose running parts the test can read (its live requests, its metrics)."""

    port: int
    gateway: Gateway

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def loopback_listener(send_buffer_bytes: int | None = None) -> socket.socket:
    """A listening socket on a free loopback port. `send_buffer_bytes` caps the kernel's send buffer of every
    connection it accepts (Linux copies it to them), so a client that stops reading holds the server's sends after
    a few kB instead of several MB of loopback buffers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if send_buffer_bytes is not None:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)  # connections queue until uvicorn accepts them: nothing to poll for
    return listener


@contextlib.asynccontextmanager
async def watched_gateway_on(settings: GatewaySettings,
                             send_buffer_bytes: int | None = None) -> AsyncIterator[WatchedGateway]:
    """The real gateway service under uvicorn on 127.0.0.1 (see `loopback_listener`), with its parts in reach."""
    with loopback_listener(send_buffer_bytes) as listener:
        async with gateway_service(settings, listener) as (gateway, _app):
            yield WatchedGateway(listener.getsockname()[1], gateway)


@pytest.fixture
def watched_gateway(gateway_bus: BusHandles, gateway_model_dir: Path):
    """`async with watched_gateway(**settings) as served:` the gateway on the test's bus (stand-in mesh), under
    uvicorn, `served.gateway` its running parts."""

    def start(**overrides) -> contextlib.AbstractAsyncContextManager[WatchedGateway]:
        return watched_gateway_on(gateway_settings(gateway_bus, gateway_model_dir, **overrides))

    return start


@pytest.fixture
def served_gateway(gateway_bus: BusHandles, gateway_model_dir: Path):
    """`async with served_gateway(**settings) as port:` the real gateway under uvicorn on 127.0.0.1 (a free port
    bound here, so the port is known before the server starts), stopped through its `stop` event."""

    @contextlib.asynccontextmanager
    async def start(**overrides) -> AsyncIterator[int]:
        settings = gateway_settings(gateway_bus, gateway_model_dir, **overrides)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()  # connections queue until uvicorn accepts them: nothing to poll for
            stop = asyncio.Event()
            server = asyncio.create_task(serve(settings, stop, sockets=[listener]))
            try:
                yield listener.getsockname()[1]
            finally:
                stop.set()
                await server

    return start


@contextlib.asynccontextmanager
async def standin_http_client(standin: StandInMesh, served_gateway, num_chunks: int) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a served gateway whose stand-in decode answers every request with `num_chunks` chunks."""
    standin.plan = Plan(num_chunks=num_chunks)
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        yield http
