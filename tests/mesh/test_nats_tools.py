"""What the NATS CLI shows a user watching a running mesh (README, "Watching it"), driven through the same protocol
with nats-py, against `voxmesh up`:

- `nats micro ls` / `nats micro info` / `nats micro stats voxmesh-decode`: `$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`
  answered by every service;
- `nats stream ls` and `nats kv ls voxmesh`: the JetStream API lists the streams and the bucket's keys;
- `nats sub 'tts.events.>'`: a subscriber sees a request's whole lifecycle;
- the embedded server's HTTP monitoring (`/varz`, `/jsz`) on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from fnmatch import fnmatchcase
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client

from messages import LifecycleEvent, decode, subjects
from messages.streams import BUCKET, CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from services.runtime.lifecycle import micro_name
from tests.support.mesh import Mesh, run_mesh

SERVICES = tuple(micro_name(service) for service in ("gateway", "decode", "vocoder"))
WAIT_S = 60.0


@pytest.fixture(scope="module")
def health_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("health")


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory, health_dir) -> Iterator[Mesh]:
    """`voxmesh up` whose services record their micro service ids for `voxmesh health` (as the image does)."""
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("mesh-state"),
                  env={"VOXMESH_HEALTH_DIR": str(health_dir)}) as running:
        yield running


@pytest.fixture
async def bus(mesh) -> AsyncIterator[Client]:
    nc = await nats.connect(mesh.nats_url)
    try:
        yield nc
    finally:
        await nc.close()


async def replies_by_service(nc: Client, subject: str, expected: tuple[str, ...]) -> dict[str, dict]:
    """Publish one discovery request and gather replies until every expected service has answered."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(subject, b"", reply=inbox)
        found: dict[str, dict] = {}
        while not set(expected) <= found.keys():
            reply = json.loads((await sub.next_msg(timeout=WAIT_S)).data)
            found[reply["name"]] = reply
        return found
    finally:
        await sub.unsubscribe()


@pytest.mark.parametrize("subject, kind", [(subjects.micro_ping(), "ping"), (subjects.micro_info(), "info"),
                                           (subjects.micro_stats(), "stats")])
async def test_every_service_answers_discovery(bus, subject, kind):
    replies = await replies_by_service(bus, subject, SERVICES)
    for name in SERVICES:
        assert replies[name]["type"] == f"io.nats.micro.v1.{kind}_response", replies[name]
        assert replies[name]["id"] and replies[name]["version"]
    if kind == "info":
        assert all(reply["metadata"].get("replica") for reply in replies.values())
    if kind == "stats":  # `nats micro stats voxmesh-decode`: decode's counters are each endpoint's data
        decode_stats = replies[micro_name("decode")]
        assert decode_stats["endpoints"], decode_stats
        assert "kv_blocks_total" in (decode_stats["endpoints"][0].get("data") or {}), decode_stats


async def test_one_service_answers_its_own_subject(bus):
    replies = await replies_by_service(bus, subjects.micro_stats(micro_name("decode")), (micro_name("decode"),))
    assert set(replies) == {micro_name("decode")}
    instance = replies[micro_name("decode")]["id"]
    reply = await bus.request(subjects.micro_ping_instance(micro_name("decode"), instance), b"", timeout=WAIT_S)
    assert json.loads(reply.data)["id"] == instance


async def test_jetstream_lists_the_streams_and_the_bucket(bus):
    js = bus.jetstream()
    names = {info.config.name for info in await js.streams_info()}
    assert {REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM, f"KV_{BUCKET}"} <= names, names
    keys = await (await js.key_value(BUCKET)).keys()
    assert any(fnmatchcase(key, subjects.all_lease_keys()) for key in keys), keys
    assert any(fnmatchcase(key, subjects.all_partition_keys()) for key in keys), keys


async def test_a_subscriber_on_all_events_sees_a_request_from_acceptance_to_its_end(bus, mesh):
    seen: dict[str, list[str]] = {}
    ended: dict[str, asyncio.Event] = {}

    async def on_event(msg) -> None:
        event = decode(msg.data, LifecycleEvent)
        seen.setdefault(event.request_id, []).append(msg.subject.rsplit(".", 1)[-1])
        if msg.subject == subjects.terminal(event.request_id):
            ended.setdefault(event.request_id, asyncio.Event()).set()

    sub = await bus.subscribe(subjects.all_events(), cb=on_event)
    await bus.flush()
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        response = await client.post(f"{mesh.gateway_url}/v1/audio/speech",
                                     json={"input": "Watch me on the bus.", "voice": "vivian", "max_new_tokens": 8})
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    await asyncio.wait_for(ended.setdefault(request_id, asyncio.Event()).wait(), WAIT_S)
    await sub.unsubscribe()
    kinds = seen[request_id]  # in arrival order: the gateway's `accepted` and decode's `started` may cross
    assert kinds[-1] == "terminal" and kinds.count("terminal") == 1, kinds
    assert {"accepted", "started", "first_frame", "first_audio"} <= set(kinds), kinds


async def test_http_monitoring_is_on_loopback(mesh):
    assert mesh.monitor_url.startswith("http://127.0.0.1:"), mesh.monitor_url
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        varz = (await client.get(f"{mesh.monitor_url}/varz")).json()
        jsz = (await client.get(f"{mesh.monitor_url}/jsz")).json()
    assert varz["host"] == "127.0.0.1" and varz["jetstream"]["config"]["store_dir"], varz
    assert jsz["streams"] >= 4, jsz  # REQUESTS, EVENTS, CODES and the bucket's stream


def voxmesh_health(mesh: Mesh, health_dir: Path, *python_flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VOXMESH_NATS_URL": mesh.nats_url, "VOXMESH_HEALTH_DIR": str(health_dir)}
    return subprocess.run([sys.executable, *python_flags, "-m", "services.cli", "health"], env=env,
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def test_voxmesh_health_asks_each_recorded_service_its_own_ping(mesh, health_dir):
    """The container healthcheck: every service of the process answers `$SRV.PING.<name>.<its id>`."""
    done = voxmesh_health(mesh, health_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line.split()[0] for line in done.stdout.splitlines()) == sorted(SERVICES), done.stdout
    stale = health_dir / "voxmesh-ghost.json"  # an instance that is gone: no one answers for it
    stale.write_text(json.dumps({"name": "voxmesh-ghost", "id": "GONE", "replica": "ghost-1"}))
    try:
        done = voxmesh_health(mesh, health_dir)
    finally:
        stale.unlink()
    assert done.returncode == 1 and "voxmesh-ghost GONE (ghost-1): no answer" in done.stdout, done.stdout


def test_voxmesh_health_imports_no_torch(mesh, health_dir):
    """The healthcheck has seconds to answer (compose's `timeout`); importing torch takes seconds on a busy machine,
    and once made a loaded CI host's decode container unhealthy. Every module it loads, asking every service, is
    named by `-X importtime`: torch and triton are not among them."""
    done = voxmesh_health(mesh, health_dir, "-X", "importtime")
    assert done.returncode == 0, done.stdout + done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"services.runtime.health_record", "nats"} <= imported, sorted(imported)
    assert not {name for name in imported if name.split(".")[0] in ("torch", "triton")}, "torch or triton imported"
