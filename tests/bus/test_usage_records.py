"""Usage records on a real nats-server: two gateways' recorders share the terminal events and store exactly one
record per request; a terminal redelivered after a gateway stored its record but died before acking it is not
counted again (the subject fence refuses the second record, whatever its Msg-Id); the operator route sums the
records for an operator key only."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import AsyncIterator

import pytest

from messages import encode, subjects
from messages.errors import ErrorCode, Stage
from messages.events import Accepted, Failed, Finished, event_subject
from messages.streams import EVENTS_STREAM, USAGE_CONSUMER, USAGE_STREAM
from messages.usage import UsageRecord
from services.bus import connect
from services.bus.fencing import MSG_ID
from services.bus.terminal_guard import publish_terminal
from services.usage.reader import read_usage
from services.usage.recorder import UsageRecorder, publish_usage
from services.usage.totals import UsageQuery, grand_total, usage_rows
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, gateway_factory)

pytestmark = pytest.mark.timeout(90)

TIMEOUT_S = 30.0
CLIENT, ADMIN = "client-key-1", "admin-key-1"


@pytest.fixture
def bus_overrides() -> dict:
    return {"usage_ack_wait_s": 1.0}  # a terminal taken by a gateway that died comes back after a second


@contextlib.asynccontextmanager
async def recorders(url: str, count: int) -> AsyncIterator[list[UsageRecorder]]:
    """`count` recorders, each on its own connection (as many gateways), running until the block ends."""
    stop = asyncio.Event()
    connections = [await connect(url, f"usage-test-{n}", initial_timeout_s=10.0) for n in range(count)]
    running = [UsageRecorder(nc, nc.jetstream()) for nc in connections]
    tasks = [asyncio.create_task(recorder.run(stop)) for recorder in running]
    try:
        yield running
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for nc in connections:
            await nc.close()


async def admit(js, request_id: str, tenant: str, chars: int) -> None:
    """What the admitting gateway publishes: the `accepted` event."""
    event = Accepted(request_id=request_id, at=time.time(), model="tiny", seed=1, text_chars=chars, tenant=tenant)
    await js.publish(event_subject(event), encode(event), stream=EVENTS_STREAM)


def iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat()


def finished(request_id: str, frames: int) -> Finished:
    return Finished(request_id=request_id, at=time.time(), frames=frames, audio_seconds=frames / 12.5,
                    chunk_count=frames)


def failed(request_id: str, frames: int) -> Failed:
    return Failed(request_id=request_id, at=time.time(), stage=Stage.DECODE, code=ErrorCode.REPLICA_LOST,
                  reason="gone", frames=frames, chunk_count=frames)


async def until_stored(js, count: int) -> None:
    """Until USAGE has received `count` records (read through JetStream, as they are stored)."""
    arrived = asyncio.Queue()
    subscription = await js.subscribe(subjects.all_usage(), stream=USAGE_STREAM, ordered_consumer=True,
                                      cb=arrived.put)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            for _ in range(count):
                await arrived.get()
    finally:
        await subscription.unsubscribe()


async def records_by_request(js) -> dict[str, list[UsageRecord]]:
    found: dict[str, list[UsageRecord]] = {}
    for record in await read_usage(js, 0.0):
        found.setdefault(record.request_id, []).append(record)
    return found


async def test_two_gateways_record_every_terminal_once_with_its_tenant(gateway_bus):
    js = gateway_bus.js
    ends = {f"r{n}": (finished if n % 3 else failed)(f"r{n}", 5 + n) for n in range(12)}
    async with recorders(gateway_bus.url, 2) as both:
        for n, (request_id, end) in enumerate(ends.items()):
            await admit(js, request_id, ("acme", "", "beta")[n % 3], chars=10 + n)
            assert await publish_terminal(js, request_id, end)
        assert not await publish_terminal(js, "r1", failed("r1", 1)), "the guard keeps one terminal per request"
        await until_stored(js, len(ends))
    stored = await records_by_request(js)
    assert sorted(stored) == sorted(ends) and all(len(records) == 1 for records in stored.values())
    assert (await js.stream_info(USAGE_STREAM)).state.messages == len(ends)
    for n, (request_id, end) in enumerate(ends.items()):
        record = stored[request_id][0]
        assert (record.tenant, record.model, record.characters) == (("acme", "", "beta")[n % 3], "tiny", 10 + n)
        assert record.audio_seconds == pytest.approx(end.frames / 12.5)
        assert record.outcome == ("finished" if isinstance(end, Finished) else "failed")
    rows = usage_rows([records[0] for records in stored.values()], UsageQuery(0.0, time.time() + 60))
    by_tenant = {row.tenant: row for row in rows}
    assert {tenant: (row.requests, row.errors) for tenant, row in by_tenant.items()} == {
        "": (4, 0), "acme": (4, 4), "beta": (4, 0)}
    assert grand_total(rows).characters == sum(10 + n for n in range(12))


async def test_a_terminal_redelivered_after_its_record_was_stored_is_not_counted_again(gateway_bus):
    js = gateway_bus.js
    await admit(js, "dies", "acme", 12)
    assert await publish_terminal(js, "dies", finished("dies", 10))
    # A gateway takes the terminal, stores its record and dies before its ack.
    dying = await js.pull_subscribe_bind(USAGE_CONSUMER, stream=EVENTS_STREAM)
    (taken,) = await dying.fetch(1, timeout=TIMEOUT_S)
    assert taken.subject == subjects.terminal("dies")
    first = UsageRecord(request_id="dies", at=time.time(), tenant="acme", model="tiny", characters=12,
                        audio_seconds=0.8)
    assert await publish_usage(js, first)
    assert not await publish_usage(js, first), "a retry inside the duplicate window is recognised"
    # Past the duplicate window the Msg-Id no longer protects it: the subject's fence still does.
    with pytest.raises(Exception):
        await js.publish(subjects.usage("dies"), encode(first), stream=USAGE_STREAM,
                         headers={MSG_ID: "another-id", "Nats-Expected-Last-Subject-Sequence": "0"})
    await dying.unsubscribe()
    async with recorders(gateway_bus.url, 1) as (survivor,):
        async with asyncio.timeout(TIMEOUT_S):
            await survivor.until_settled(1)  # redelivered after the ack wait
    assert (survivor.num_recorded, survivor.num_already_recorded) == (0, 1)
    assert [len(records) for records in (await records_by_request(js)).values()] == [1]


async def test_a_terminal_without_an_accepted_event_is_recorded_without_tenant_after_its_retries(gateway_bus):
    js = gateway_bus.js
    assert await publish_terminal(js, "orphan", finished("orphan", 4))
    async with recorders(gateway_bus.url, 1) as (recorder,):
        async with asyncio.timeout(TIMEOUT_S):
            await recorder.until_settled(1)
    (record,) = (await records_by_request(js))["orphan"]
    assert (record.tenant, record.model, record.audio_seconds) == ("", "", pytest.approx(0.32))


async def test_the_operator_route_sums_the_records_for_an_operator_key_only(gateway_bus, gateway_factory):
    now = time.time()
    for n, tenant in enumerate(("acme", "acme", "beta")):
        await publish_usage(gateway_bus.js, UsageRecord(request_id=f"u{n}", at=now - n, tenant=tenant, model="tiny",
                                                        characters=5, audio_seconds=1.5, outcome="finished"))
    old = UsageRecord(request_id="old", at=now - 40 * 86400, tenant="acme", model="tiny", characters=5)
    await publish_usage(gateway_bus.js, old)
    async with gateway_factory(api_keys=CLIENT, admin_api_keys=ADMIN) as client:
        refused = [await client.get("/admin/usage", headers=headers) for headers in
                   ({}, {"Authorization": f"Bearer {CLIENT}"})]
        admin = {"Authorization": f"Bearer {ADMIN}"}
        everyone = (await client.get("/admin/usage", headers=admin, params={"from": "2000-01-01"})).json()
        acme = (await client.get("/admin/usage", headers=admin,
                                 params={"tenant": "acme", "from": iso(now - 3600), "to": iso(now + 60)})).json()
        bad = await client.get("/admin/usage", headers=admin, params={"from": "soon"})
    assert [response.status_code for response in refused] == [401, 401]
    assert (everyone["total"]["requests"], everyone["total"]["characters"]) == (4, 20)
    assert everyone["total"]["audio_seconds"] == pytest.approx(4.5)
    assert acme["total"]["requests"] == 2 and {row["tenant"] for row in acme["rows"]} == {"acme"}
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"
