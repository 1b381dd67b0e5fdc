"""A lease renewal that times out never stops a replica: the keeper retries with backoff, logs the streak once, and
renews afterwards. Injected into the lease keeper of each service (gateway, decode, vocoder), on a real nats-server:
the KV bucket the keeper writes through fails its next puts with nats' TimeoutError, as a bus blip would."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
import pytest

from services.bus.leases import LeaseKeeper, read_lease
from services.runtime import lifecycle
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, gateway_factory...)
from tests.support.decode_stubs import running_decode
from tests.support.vocoder_stubs import bus, codec_model_dir, running_vocoder  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(120)

FAILURES = 4
WAIT_S = 30.0


class FlakyPuts:
    """A KV bucket whose puts after the first fail `failures` times with a timeout, then work again."""

    def __init__(self, kv, failures: int) -> None:
        self._kv = kv
        self.failures_left = failures
        self.puts = 0
        self.renewed_after_failures = 0
        self._changed = asyncio.Event()

    async def put(self, key: str, value: bytes) -> int:
        self.puts += 1
        if self.puts > 1 and self.failures_left:
            self.failures_left -= 1
            raise nats.errors.TimeoutError
        revision = await self._kv.put(key, value)
        if self.puts > 1 and not self.failures_left:
            self.renewed_after_failures += 1
            self._changed.set()
        return revision

    async def until_renewed_after_failures(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while self.renewed_after_failures < count:
                self._changed.clear()
                await self._changed.wait()

    def __getattr__(self, name: str):
        return getattr(self._kv, name)


@pytest.fixture
def flaky_leases(monkeypatch) -> list[FlakyPuts]:
    """Every lease keeper a service starts in this test writes through a FlakyPuts."""
    made: list[FlakyPuts] = []

    def keeper(kv, replica: str, service: str, **timing) -> LeaseKeeper:
        made.append(FlakyPuts(kv, FAILURES))
        return LeaseKeeper(made[-1], replica, service, **timing)

    monkeypatch.setattr(lifecycle, "LeaseKeeper", keeper)
    return made


async def renewed_through_the_blip(flaky: FlakyPuts, kv, replica: str, service: asyncio.Task | None) -> None:
    """Two renewals after the failures; the service never stopped, and its lease is fresh."""
    await flaky.until_renewed_after_failures(2)
    assert flaky.failures_left == 0
    if service is not None:
        assert not service.done()
    lease = await read_lease(kv, replica)
    assert lease is not None and time.time() - lease.renewed_at < lease.ttl_s


async def test_the_keeper_retries_a_timed_out_renewal_and_logs_the_streak_once(gateway_bus, caplog):
    flaky = FlakyPuts(gateway_bus.kv, FAILURES)
    keeper = LeaseKeeper(flaky, "blip-a", "decode", interval_s=0.2, ttl_s=5.0)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="services.bus.leases"):
        task = asyncio.create_task(keeper.run(stop))
        await renewed_through_the_blip(flaky, gateway_bus.kv, "blip-a", task)
        stop.set()
        await task
    messages = [r.getMessage() for r in caplog.records]
    assert sum("renewal failed" in m for m in messages) == 1
    assert sum(f"renewed again after {FAILURES} failed attempt(s)" in m for m in messages) == 1
    assert await read_lease(gateway_bus.kv, "blip-a") is None  # released at a clean stop


async def test_the_gateway_keeps_serving_through_a_lease_renewal_timeout(flaky_leases, standin, gateway_factory,
                                                                         gateway_bus):
    standin.start_consumer()
    async with gateway_factory() as client:
        await renewed_through_the_blip(flaky_leases[0], gateway_bus.kv, "gateway-test", None)
        response = await client.post("/v1/audio/speech", json={"input": "Still here.", "voice": "ryan"})
        assert response.status_code == 200


async def test_decode_keeps_serving_through_a_lease_renewal_timeout(flaky_leases, nats_server, tiny_checkpoint):
    async with running_decode(nats_server.url, tiny_checkpoint) as decode:
        await renewed_through_the_blip(flaky_leases[0], decode.kv, "decode-test", decode.task)
        decode.check_running()


async def test_the_vocoder_keeps_serving_through_a_lease_renewal_timeout(flaky_leases, bus, codec_model_dir):
    async with running_vocoder(bus, codec_model_dir, replica="vocoder-blip") as task:
        await renewed_through_the_blip(flaky_leases[0], bus.kv, "vocoder-blip", task)
