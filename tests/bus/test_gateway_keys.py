"""Client and operator keys: every /v1 route and the WebSocket need a client key, /metrics an operator key (the
admin keys when set, else a client key); neither kind opens the other's routes."""

from __future__ import annotations

import pytest
import websockets

from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, gateway_factory...)

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast

CLIENT, ADMIN = "client-key-1", "admin-key-1"
V1_ROUTES = ["/v1/models", "/v1/models/tiny", "/v1/audio/voices"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_every_v1_route_needs_a_client_key_and_an_admin_key_is_not_one(gateway_factory):
    async with gateway_factory(api_keys=CLIENT, admin_api_keys=ADMIN) as client:
        for route in V1_ROUTES:
            assert (await client.get(route)).status_code == 401, route
            assert (await client.get(route, headers=bearer("wrong"))).status_code == 401, route
            assert (await client.get(route, headers=bearer(ADMIN))).status_code == 401, route
            assert (await client.get(route, headers=bearer(CLIENT))).status_code == 200, route
        speech = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "ryan"}, headers=bearer(ADMIN))
        assert speech.status_code == 401


async def test_metrics_need_the_admin_key_and_a_client_key_does_not_open_them(gateway_factory):
    async with gateway_factory(api_keys=CLIENT, admin_api_keys=ADMIN) as client:
        missing = await client.get("/metrics")
        as_client = await client.get("/metrics", headers=bearer(CLIENT))
        as_admin = await client.get("/metrics", headers=bearer(ADMIN))
        health = await client.get("/health")
    assert missing.status_code == as_client.status_code == 401
    assert as_admin.status_code == 200 and "voxmesh" in as_admin.text
    assert health.status_code == 200  # probes stay open


async def test_without_admin_keys_the_metrics_take_a_client_key_and_without_keys_they_are_open(gateway_factory):
    async with gateway_factory(api_keys=CLIENT) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=bearer(CLIENT))).status_code == 200
    async with gateway_factory() as client:
        assert (await client.get("/metrics")).status_code == 200


async def test_the_websocket_refuses_an_admin_key(served_gateway):
    async with served_gateway(api_keys=CLIENT, admin_api_keys=ADMIN) as port:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/audio/speech/stream",
                                          additional_headers=bearer(ADMIN)):
                pass
    assert refused.value.response.status_code == 403
