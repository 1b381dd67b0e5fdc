"""Usage on the real mesh (`voxmesh up`: gateway, decode, vocoder, the tiny checkpoint) with a second gateway in the
test's process: requests streamed through both gateways while decode is killed (SIGKILL) mid-stream are counted
once each, and the totals that both gateways' operator route and `voxmesh usage` give equal what the clients
received: requests, characters, seconds of audio, errors.

Both gateways' recorders share the terminal events (one durable consumer), so which one records a request is the
bus's choice; the test does not care which, only that the USAGE stream holds one record per request. Nothing sleeps:
the records are awaited as JetStream delivers them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import pytest

from messages import decode, subjects
from messages.audio_format import BYTES_PER_SAMPLE, SAMPLE_RATE
from messages.streams import USAGE_STREAM
from messages.usage import UsageRecord
from tests.support.gateway_fixtures import gateway_settings_on_mesh, watched_gateway_on
from tests.support.mesh import REPO, run_mesh
from tests.support.mesh_client import FAULT_BODIES, WAIT_S, LiveStream, follow

pytestmark = pytest.mark.timeout(420)

ADMIN = "operator-key-of-the-usage-test"
SHORT = {"input": "Short and done.", "voice": "eric", "max_new_tokens": 12, "ignore_eos": True, "seed": 9}


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    """This module's own mesh (decode is killed here), with an operator key on its gateway."""
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("usage-mesh"),
                  env={"VOXMESH_CODEC_BATCHING": "false", "VOXMESH_ADMIN_API_KEYS": ADMIN}) as running:
        yield running


async def usage_records(nats_url: str, request_ids: set[str]) -> list[UsageRecord]:
    """Every record on USAGE once each of `request_ids` has one (read through JetStream as they are stored), and
    each record's subject's message count."""
    nc = await nats.connect(nats_url)
    try:
        subscription = await nc.jetstream().subscribe(subjects.all_usage(), stream=USAGE_STREAM,
                                                      ordered_consumer=True)
        records: list[UsageRecord] = []
        while not request_ids <= {record.request_id for record in records}:
            records.append(decode((await subscription.next_msg(timeout=WAIT_S)).data, UsageRecord))
        info = await nc.jetstream().stream_info(USAGE_STREAM, subjects_filter=subjects.all_usage())
        assert all(count == 1 for count in (info.state.subjects or {}).values()), info.state.subjects
        return records
    finally:
        await nc.close()


async def playing(bodies: list[tuple[str, dict]]) -> tuple[list[LiveStream], list[asyncio.Task]]:
    """Each (gateway, body) streamed at once; returns once every one has audio."""
    lives = [LiveStream() for _ in bodies]
    tasks = [asyncio.create_task(follow(url, body, live)) for (url, body), live in zip(bodies, lives)]
    await asyncio.wait_for(asyncio.gather(*(live.first_audio.wait() for live in lives)), WAIT_S)
    return lives, tasks


def received_seconds(live: LiveStream) -> float:
    return len(live.pcm) / (BYTES_PER_SAMPLE * SAMPLE_RATE)


def cli_usage(gateway_url: str, key_file: Path) -> dict:
    """`voxmesh usage --json`, the operator key given the way it takes secrets (a file, never argv)."""
    key_file.write_text(ADMIN, encoding="utf-8")
    env = dict(os.environ, VOXMESH_ADMIN_API_KEY_FILE=str(key_file))
    done = subprocess.run([sys.executable, "-m", "services.cli", "usage", "--url", gateway_url, "--json",
                           "--from", "2000-01-01"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ADMIN not in done.stdout + done.stderr
    return json.loads(done.stdout)


async def test_usage_after_a_decode_kill_mid_stream_equals_what_the_clients_received_once_each(mesh, tiny_checkpoint,
                                                                                               tmp_path):
    settings = gateway_settings_on_mesh(mesh.nats_url, tiny_checkpoint, admin_api_keys=ADMIN)
    async with watched_gateway_on(settings) as second:
        bodies = [(mesh.gateway_url, FAULT_BODIES[0]), (second.url, FAULT_BODIES[1]), (second.url, SHORT)]
        lives, tasks = await playing(bodies)
        restarted = mesh.expect_restart("decode")
        os.kill(mesh.pids["decode"], signal.SIGKILL)
        frames_at_kill = [len(live.frames) for live in lives]
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
        records = await usage_records(mesh.nats_url, {live.request_id for live in lives})
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            unauthorized = await client.get(f"{mesh.gateway_url}/admin/usage")
            answers = [(await client.get(f"{url}/admin/usage", params={"from": "2000-01-01"},
                                         headers={"Authorization": f"Bearer {ADMIN}"})).json()
                       for url in (mesh.gateway_url, second.url)]
    answers.append(await asyncio.to_thread(cli_usage, mesh.gateway_url, tmp_path / "operator.key"))
    assert await asyncio.to_thread(restarted.wait, 60)
    assert all(live.end.get("type") in ("audio.done", "error") for live in lives), [live.end for live in lives]
    assert all(0 < frames_at_kill[n] < FAULT_BODIES[n]["max_new_tokens"] for n in (0, 1)), "killed mid-stream"
    by_request = {record.request_id: record for record in records}
    assert len(records) == len(by_request) == len(lives), "one record per request"
    for live, (_, body) in zip(lives, bodies):
        record = by_request[live.request_id]
        assert (record.tenant, record.model, record.characters) == ("", "tiny", len(body["input"]))
        assert record.audio_seconds == pytest.approx(received_seconds(live), abs=1e-6), live.request_id
        assert (record.outcome == "failed") == (live.end.get("type") == "error")
    assert unauthorized.status_code == 401
    expected = {"requests": len(lives), "characters": sum(len(body["input"]) for _, body in bodies),
                "errors": sum(live.end.get("type") == "error" for live in lives)}
    for answer in answers:
        total = answer["total"]
        assert {name: total[name] for name in expected} == expected, answer
        assert total["audio_seconds"] == pytest.approx(sum(map(received_seconds, lives)), abs=1e-6)
        assert [(row["tenant"], row["model"]) for row in answer["rows"]] == [("", "tiny")]
