"""Requests faster than admission allows (real gateway under uvicorn, real nats-server, the stand-in decode/vocoder):
past `--max-live-requests` the gateway answers 429 `too_many_requests` with Retry-After at once, nothing piles up on
the queue, the admitted requests are served in full, and once they end the gateway is empty and admits again."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from messages import subjects
from messages.events import Accepted
from messages.streams import REQUESTS_STREAM
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, watched_gateway...)
from tests.support.gateway_standin import Plan, expected_pcm
from tests.support.http_client import sample, scrape
from tests.support.ws_client import ws_connect

pytestmark = pytest.mark.timeout(60)

LIMIT = 3
BURST = 12


async def test_a_burst_past_the_limit_gets_429_at_once_and_nothing_piles_up(standin, watched_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=2)
    # No consumer yet: admitted requests wait on REQUESTS, so every refusal below comes while they are live.
    # The gateway announces `accepted` once the queue has stored a request: what the check below waits for.
    accepted = await gateway_bus.nc.subscribe(subjects.events_of_kind(Accepted.KIND))
    async with watched_gateway(max_live_requests=LIMIT, retry_after_s=2) as served, \
            httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        live = served.gateway.synthesizer.supervisor.live
        burst = [asyncio.ensure_future(client.post("/v1/audio/speech", json={"input": f"Request {n}.",
                                                                              "response_format": "pcm"}))
                 for n in range(BURST)]
        refused = await first_answers(burst, BURST - LIMIT)
        for _ in range(LIMIT):
            await accepted.next_msg(timeout=30)
        queued = (await gateway_bus.js.stream_info(REQUESTS_STREAM)).state.messages
        live_while_refusing = len(live)
        standin.start_consumer()
        admitted = await asyncio.gather(*[r for r in burst if not r.done()])
        await live.until_none()
        after = await client.post("/v1/audio/speech", json={"input": "Room again.", "response_format": "pcm"})
        metrics = scrape((await client.get("/metrics")).text)
    assert (queued, live_while_refusing) == (LIMIT, LIMIT), "nothing past the limit reached the queue"
    for response in refused:
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["type"]) == (429, "too_many_requests", "rate_limit_error")
        assert response.headers["retry-after"] == "2" and "--max-live-requests" in error["message"]
    assert [r.status_code for r in admitted] == [200] * LIMIT
    assert all(r.content == expected_pcm(2) for r in admitted)
    assert after.status_code == 200
    assert sample(metrics, "voxmesh_requests_total", outcome="refused", code="too_many_requests") == BURST - LIMIT
    assert sample(metrics, "voxmesh_live_requests") == 0


async def first_answers(requests: list[asyncio.Future], count: int) -> list[httpx.Response]:
    """The first `count` requests to be answered (the refusals: the admitted ones cannot end yet)."""
    done: list[httpx.Response] = []
    pending = set(requests)
    while len(done) < count:
        finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        done += [future.result() for future in finished]
    assert len(done) == count, "an admitted request ended before the mesh could serve it"
    return done


async def test_a_websocket_segment_past_the_limit_gets_an_error_event_and_the_socket_goes_on(standin,
                                                                                           watched_gateway):
    standin.plan = Plan(num_chunks=1)
    async with watched_gateway(max_live_requests=1) as served, ws_connect(served.url) as holder, \
            ws_connect(served.url) as client:
        await holder.send("input.text", text="I hold the only slot.\n")
        await holder.until("audio.start")  # admitted; it waits on REQUESTS (no consumer yet)
        await client.send("input.text", text="No room for me.\n")
        refused = (await client.until("error", "audio.start")).event
        standin.start_consumer()
        held = await holder.until("audio.done", "error")
        await served.gateway.synthesizer.supervisor.live.until_none()
        await client.send("input.text", text="Now there is.\n")
        later = await client.until("audio.done", "error")
    assert (refused["type"], refused["code"]) == ("error", "too_many_requests"), refused
    assert held.event["type"] == later.event["type"] == "audio.done"
    assert later.pcm == expected_pcm(1)
