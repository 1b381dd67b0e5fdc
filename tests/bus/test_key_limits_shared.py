"""Each key's limits kept on a real bus and shared by two gateways (two SharedLimits of different replicas, each on
its own connection): the token bucket, live seats (and a dead gateway's seats freed once its lease lapses) and the
day's audio, all by compare-and-set on the `voxmesh-limits` bucket."""

from __future__ import annotations

import asyncio

import pytest

from messages.errors import ErrorCode
from messages.key_limits import LIMITS_BUCKET
from messages.streams import BusConfig
from services.bus.connection import connect
from services.bus.leases import LeaseKeeper
from services.bus.provision import open_bucket
from services.gateway.tenancy.refusals import LimitRefused
from services.gateway.tenancy.shared_limits import SharedLimits
from services.gateway.tenancy.tenant import Limits, Tenant
from tests.support.nats_server import fresh_bus


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def two_gateways(nats_server):
    """Two gateways' limiters (replicas g1, g2) on their own connections, with live leases, and a shared clock."""
    connections, keepers, renewals = [], [], []
    stop = asyncio.Event()
    clock = Clock(1_700_000_000.0)
    first = await connect(nats_server.url, "limits-test-0", initial_timeout_s=10.0)
    connections.append(first)
    await fresh_bus(first.jetstream(), BusConfig(models=("tiny",), storage="memory"))
    limiters = []
    for index, replica in enumerate(("g1", "g2")):
        nc = first if index == 0 else await connect(nats_server.url, f"limits-test-{index}", initial_timeout_s=10.0)
        if index:
            connections.append(nc)
        js = nc.jetstream()
        leases = await open_bucket(js)
        keeper = LeaseKeeper(leases, replica, "gateway", interval_s=0.2, ttl_s=0.6)
        await keeper.renew()
        keepers.append(keeper)
        renewals.append(asyncio.create_task(keeper.run(stop)))
        limiters.append(SharedLimits(await open_bucket(js, LIMITS_BUCKET), leases, replica, clock=clock))
    try:
        yield limiters, renewals, clock
    finally:
        stop.set()
        await asyncio.gather(*renewals, return_exceptions=True)
        for nc in connections:
            await nc.close()


def key(**limits) -> Tenant:
    return Tenant(name="k", limit_key="k", key_class="pro", limits=Limits(**limits))


async def test_the_token_bucket_is_one_across_gateways(two_gateways):
    (g1, g2), _, clock = two_gateways
    tenant = key(requests_per_s=1.0, burst=4)
    outcomes = await asyncio.gather(*(limiter.admit(tenant) for limiter in (g1, g2) * 4), return_exceptions=True)
    admitted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, LimitRefused)]
    assert len(admitted) == 4 and len(refused) == 4, outcomes
    assert {r.code for r in refused} == {ErrorCode.RATE_LIMITED}
    assert sorted(a.rate.remaining for a in admitted) == [0, 1, 2, 3]
    assert refused[0].headers()["x-ratelimit-limit-requests"] == "4"
    assert refused[0].headers()["Retry-After"] == "1"
    clock.now += 1.0  # one token back
    await g2.admit(tenant)
    with pytest.raises(LimitRefused):
        await g1.admit(tenant)


async def test_live_seats_are_one_count_across_gateways_and_come_back(two_gateways):
    (g1, g2), _, _ = two_gateways
    tenant = key(live_requests=3)
    held = [await g1.admit(tenant), await g2.admit(tenant), await g2.admit(tenant)]
    for limiter in (g1, g2):
        with pytest.raises(LimitRefused) as refused:
            await limiter.admit(tenant)
        assert refused.value.code is ErrorCode.TOO_MANY_LIVE_REQUESTS and refused.value.status == 429
    await g2.release(held.pop())
    held.append(await g1.admit(tenant))
    with pytest.raises(LimitRefused):
        await g2.admit(tenant)


async def test_racing_gateways_never_seat_more_than_the_limit(two_gateways):
    (g1, g2), _, _ = two_gateways
    tenant = key(live_requests=5)
    outcomes = await asyncio.gather(*(limiter.admit(tenant) for limiter in (g1, g2) * 8), return_exceptions=True)
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 5
    assert all(isinstance(o, LimitRefused) for o in outcomes if isinstance(o, BaseException))


async def test_a_dead_gateway_s_seats_are_freed_once_its_lease_lapses(two_gateways):
    (g1, g2), (_, g2_renewal), _ = two_gateways
    tenant = key(live_requests=2)
    await g2.admit(tenant)
    await g2.admit(tenant)  # g2 holds both seats, then dies without giving them back
    with pytest.raises(LimitRefused):
        await g1.admit(tenant)
    g2_renewal.cancel()  # a crash: the lease is neither renewed nor deleted, it lapses
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # the lease lapses 0.6 s after its last renewal; g1 re-reads liveness at most once a second
        try:
            await g1.admit(tenant)
            break
        except LimitRefused:
            assert asyncio.get_running_loop().time() < deadline, "the dead gateway's seats were never freed"
            await asyncio.sleep(0.2)
    await g1.admit(tenant)
    with pytest.raises(LimitRefused):
        await g1.admit(tenant)


async def test_the_day_s_audio_is_summed_across_gateways_and_renews_at_midnight(two_gateways):
    (g1, g2), _, clock = two_gateways
    tenant = key(audio_s_per_day=10.0)
    await g1.admit(tenant)
    await asyncio.gather(g1.charge_audio(tenant, 4.0), g2.charge_audio(tenant, 4.0))
    await g2.admit(tenant)
    await g2.charge_audio(tenant, 2.5)
    assert await g1.audio_today(tenant) == pytest.approx(10.5)
    for limiter in (g1, g2):
        with pytest.raises(LimitRefused) as refused:
            await limiter.admit(tenant)
        assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    seconds_to_midnight = 86400 - clock.now % 86400
    assert int(refused.value.headers()["Retry-After"]) == int(-(-seconds_to_midnight // 1))
    clock.now += seconds_to_midnight + 1
    await g1.admit(tenant)
