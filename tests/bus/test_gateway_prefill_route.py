"""The gateway's remote-prefill routing against a real provisioned bus: a long text goes to the prefill queue only
while a prefill replica holds a live lease and the queue has room for it (a cloned voice too: prefill does its audio
work); short texts, a mesh without live prefill replicas, a full prefill queue, and the feature turned off all keep
the request on decode's queue."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from messages import subjects
from messages.requests import SynthesisRequest
from messages.streams import BusConfig
from messages.voice_clone import VoiceClone
from services.bus.leases import LeaseKeeper
from services.bus.provision import open_bucket, provision
from services.bus.submit import submit_request
from services.gateway.requests.prefill_route import PrefillRoute

LONG = "A text long enough for remote prefill, by the route's threshold."


DECODE_LANE = subjects.request_for("tiny", "interactive", "")  # where an anonymous interactive request goes

def request(n: int, text: str = LONG) -> SynthesisRequest:
    return SynthesisRequest(id=f"route-{n}", model="tiny", text=text)


@pytest.fixture
async def bus(nats_client):
    js = nats_client.jetstream()
    await provision(js, BusConfig(models=("tiny",), storage="memory"))
    kv = await open_bucket(js)
    yield js, kv
    for stream in ("REQUESTS", "KV_voxmesh"):  # the next test starts with no queue and no leases
        await js.purge_stream(stream)


async def test_long_texts_go_to_a_live_prefill_replica_while_its_queue_has_room(bus):
    js, kv = bus
    route = PrefillRoute(js, kv, "tiny", min_chars=20, max_queue=2, refresh_s=0.0)
    assert await route.subject_for(request(0)) == DECODE_LANE, "no prefill replica is alive yet"
    await LeaseKeeper(kv, "prefill-a", "prefill").renew()
    assert await route.subject_for(request(1, "Too short.")) == DECODE_LANE
    cloned = msgspec.structs.replace(request(2), clone=VoiceClone(voice="mine"))
    assert await route.subject_for(cloned) == subjects.prefill_request("tiny"), "prefill does a clone's audio work"
    assert await route.subject_for(request(2)) == subjects.prefill_request("tiny")
    for n in (3, 4):  # the queue fills: two wait for the one live replica
        await submit_request(js, request(n), subject=subjects.prefill_request("tiny"))
    assert await route.subject_for(request(5)) == DECODE_LANE, "a full prefill queue: decode prefills it"
    await LeaseKeeper(kv, "prefill-b", "prefill").renew()
    assert await route.subject_for(request(6)) == subjects.prefill_request("tiny"), "a second replica, more room"


async def test_between_looks_the_route_counts_what_it_sent(bus):
    js, kv = bus
    await LeaseKeeper(kv, "prefill-a", "prefill").renew()
    route = PrefillRoute(js, kv, "tiny", min_chars=20, max_queue=2, refresh_s=3600.0)
    chosen = [await route.subject_for(request(n)) for n in range(3)]
    assert chosen == [subjects.prefill_request("tiny")] * 2 + [DECODE_LANE]


async def test_turned_off_it_never_routes_remotely(bus):
    js, kv = bus
    await LeaseKeeper(kv, "prefill-a", "prefill").renew()
    route = PrefillRoute(js, kv, "tiny", min_chars=0)
    assert await route.subject_for(request(0)) == DECODE_LANE


async def test_requests_that_arrive_during_a_look_wait_for_its_answer(bus):
    js, kv = bus
    await LeaseKeeper(kv, "prefill-a", "prefill").renew()
    route = PrefillRoute(js, kv, "tiny", min_chars=20, max_queue=2, refresh_s=3600.0)
    chosen = await asyncio.gather(*[route.subject_for(request(n)) for n in range(3)])
    assert sorted(chosen) == sorted([subjects.prefill_request("tiny")] * 2 + [DECODE_LANE])
