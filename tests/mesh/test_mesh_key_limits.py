"""Issue 42: each key's limits hold across two gateways of one mesh and across a gateway's restart.

The `voxmesh up` mesh's gateway reads a keys file (VOXMESH_KEYS_FILE); a second gateway, in the test's process,
reads the same file. Each limit refuses what it should (429, its code, Retry-After and, for the rate, OpenAI's
x-ratelimit-* headers; a WebSocket gets an `error` event with the code) and admits the rest, whichever gateway a
call goes through; after a kill -9 of the mesh's gateway, the restarted one still refuses what was spent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal

import httpx
import pytest
import websockets

from tests.support.gateway_fixtures import gateway_settings_on_mesh, watched_gateway_on
from tests.support.mesh import run_mesh
from tests.support.ws_client import PATH

SECRETS = {"burst": "secret-of-burst", "seat": "secret-of-seat", "quota": "secret-of-quota"}
FRAMES = 6  # the tiny model never stops by itself: max_new_tokens sets the length (6 frames: 0.48 s)
BODY = {"model": "tiny", "input": "Hello there.", "seed": 3, "max_new_tokens": FRAMES, "language": "english"}
KEYS_FILE = f"""
[keys.burst]
sha256 = "{hashlib.sha256(SECRETS['burst'].encode()).hexdigest()}"
class = "free"
requests_per_s = 0.001
burst = 3

[keys.seat]
sha256 = "{hashlib.sha256(SECRETS['seat'].encode()).hexdigest()}"
class = "pro"
live_requests = 1

[keys.quota]
sha256 = "{hashlib.sha256(SECRETS['quota'].encode()).hexdigest()}"
class = "pro"
audio_s_per_day = 0.4
"""


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(KEYS_FILE)
    return path


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory, keys_file):
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("key-limits"),
                  env={"VOXMESH_KEYS_FILE": str(keys_file)}) as running:
        yield running


@pytest.fixture
async def second(mesh, tiny_checkpoint, keys_file):
    settings = gateway_settings_on_mesh(mesh.nats_url, tiny_checkpoint, keys_file=str(keys_file))
    async with watched_gateway_on(settings) as served:
        yield served


async def speak(url: str, key: str, body: dict = BODY) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as client:
        return await client.post(f"{url}/v1/audio/speech", json=body, headers=bearer(key))


def assert_refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == code
    assert int(response.headers["retry-after"]) >= 1


async def restart_the_mesh_gateway(mesh) -> None:
    restarted = mesh.expect_restart("gateway")
    since = len(mesh.log)
    os.kill(mesh.pids["gateway"], signal.SIGKILL)
    assert await asyncio.to_thread(restarted.wait, 60)
    await asyncio.to_thread(mesh.wait_for_line, r"Uvicorn running on", since)


async def test_a_burst_is_shared_by_both_gateways_and_outlives_a_restart(mesh, second):
    admitted = [await speak(url, "burst") for url in (mesh.gateway_url, second.url, mesh.gateway_url)]
    assert [r.status_code for r in admitted] == [200, 200, 200], [r.text for r in admitted]
    for url in (second.url, mesh.gateway_url):
        refused = await speak(url, "burst")
        assert_refused(refused, "rate_limited")
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert (await speak(mesh.gateway_url, "seat")).status_code == 200, "another key is not limited by this one"
    await restart_the_mesh_gateway(mesh)
    assert_refused(await speak(mesh.gateway_url, "burst"), "rate_limited")


async def test_one_live_seat_across_both_gateways_http_and_websocket(mesh, second):
    """The second gateway holds the key's one seat (as a request it streams would: a tiny model's request is over
    too fast to be caught live); the mesh's gateway refuses the key over HTTP and on a WebSocket until it is back."""
    gate = second.gateway.synthesizer.gate
    seat = await gate.admit(second.gateway.keyring.authenticate(f"Bearer {SECRETS['seat']}"))
    assert_refused(await speak(mesh.gateway_url, "seat"), "too_many_live_requests")
    async with websockets.connect(mesh.gateway_url.replace("http", "ws") + PATH,
                                  additional_headers=bearer("seat")) as socket:
        await socket.send(json.dumps(BODY))
        event = json.loads(await asyncio.wait_for(socket.recv(), 60))
        assert event["type"] == "error" and event["code"] == "too_many_live_requests", event
    await gate.release(seat)
    assert (await speak(mesh.gateway_url, "seat")).status_code == 200
    assert (await speak(second.url, "seat")).status_code == 200, "each request gave its seat back when it ended"


async def test_the_day_s_audio_is_shared_and_outlives_a_restart(mesh, second):
    first = await speak(second.url, "quota")
    assert first.status_code == 200, first.text
    await second.gateway.synthesizer.gate.close()  # its audio charged to the key's day
    for url in (mesh.gateway_url, second.url):
        assert_refused(await speak(url, "quota"), "quota_exceeded")
    scraped = (await httpx.AsyncClient().get(f"{second.url}/metrics", headers=bearer("quota"))).text
    assert 'voxmesh_key_admissions_total{key_class="pro",outcome="quota_exceeded"} 1.0' in scraped
    assert "secret-of" not in scraped and "quota\"" not in scraped, "metrics name the class, never the key"
    await restart_the_mesh_gateway(mesh)
    assert_refused(await speak(mesh.gateway_url, "quota"), "quota_exceeded")
