"""Priorities and fair share on the tiny `single` mesh (issue 42 items 2 and 3): batch requests published on their
lanes as a second gateway would, an interactive one through the gateway.

Decode has two seats, one kept for interactive work (batch work holds at most the other)."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from messages import encode, subjects
from messages.events import Finished, Started
from messages.requests import SynthesisRequest
from tests.support.mesh import run_mesh
from tests.support.mesh_client import events_of, stream_speech

pytestmark = pytest.mark.asyncio
MODEL = "tiny"
SHARE = {"VOXMESH_INTERACTIVE_SHARE": "0.5"}


@pytest.fixture(scope="module")
def priority_mesh(tiny_checkpoint, tmp_path_factory):
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("mesh-state"), "--max-num-seqs", "2",
                  env=SHARE) as running:
        yield running


def _batch(request_id: str, tenant: str, frames: int) -> SynthesisRequest:
    return SynthesisRequest(id=request_id, model=MODEL, text="A chapter of a long book.", speaker="ryan", seed=1,
                            max_new_tokens=frames, ignore_eos=True, tenant=tenant, priority="batch",
                            created_at=time.time())


async def _publish(nats_url: str, requests: list[SynthesisRequest]) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for request in requests:
            await js.publish(subjects.request_for(MODEL, request.priority, request.tenant), encode(request))
    finally:
        await nc.close()


async def test_interactive_first_audio_comes_before_any_batch_request_of_a_flood_ends(priority_mesh):
    flood = [_batch(f"flood-{n}", "reader", frames=80) for n in range(4)]
    await _publish(priority_mesh.nats_url, flood)
    first_audio = asyncio.Event()
    body = {"input": "Hello, how can I help?", "voice": "ryan", "seed": 3, "max_new_tokens": 8,
            "priority": "interactive"}
    speech = asyncio.create_task(stream_speech(priority_mesh.gateway_url, body, first_audio))
    await first_audio.wait()
    heard_at = time.time()
    result = await speech
    batch_events = [await events_of(priority_mesh.nats_url, request.id) for request in flood]
    assert result.end.get("type") == "audio.done", result.end
    finished_at = [events[-1].at for events in batch_events]
    assert all(isinstance(events[-1], Finished) for events in batch_events)  # the batch work completes
    assert heard_at < min(finished_at), "the interactive request waited behind a batch request"


async def test_two_flooding_batch_keys_share_the_batch_seat(priority_mesh):
    """Key A's burst is queued whole before key B's: the batch seat still alternates between them. Tolerance: of
    the first six batch requests started, each key has two to four."""
    first = "acme"
    second = next(f"globex-{n}" for n in range(64) if subjects.tenant_lane(f"globex-{n}") != subjects.tenant_lane(first))
    burst = [_batch(f"a-{n}", first, frames=4) for n in range(6)] + [_batch(f"b-{n}", second, frames=4)
                                                                    for n in range(6)]
    await _publish(priority_mesh.nats_url, burst)
    started: dict[str, float] = {}
    for request in burst:
        events = await events_of(priority_mesh.nats_url, request.id)
        assert isinstance(events[-1], Finished), events[-1]
        [start] = [e for e in events if isinstance(e, Started)]
        started[request.id] = start.at
    order = sorted(burst, key=lambda r: started[r.id])
    assert 2 <= [r.tenant for r in order[:6]].count(second) <= 4, [r.id for r in order]
