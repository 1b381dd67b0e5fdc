"""/health, /ready, API keys on HTTP, and the gateway's settings and process wiring."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from messages import subjects
from services.gateway import service
from services.gateway.settings import GatewaySettings
from services.runtime.settings_schema import SettingsError, resolve
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, gateway_factory...)
from tests.support.gateway_standin import Plan

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


async def test_health_answers_while_the_process_runs(gateway_factory):
    async with gateway_factory() as client:
        response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "replica": "gateway-test", "nats_connected": True}


async def test_not_ready_without_decode_and_vocoder(gateway_factory):
    async with gateway_factory() as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["reasons"] == ["no decode replica holds a live lease",
                               "no vocoder partition has an owner with a live lease"]


async def test_ready_with_a_live_decode_replica_and_partition_owner(standin, gateway_factory):
    async with gateway_factory() as client:
        response = await client.get("/ready")
    assert response.status_code == 200, response.text
    assert response.json() == {"ready": True, "reasons": [], "decode_replicas": ["decode-standin"],
                               "vocoder_partitions": {"0": "vocoder-standin", "1": "vocoder-standin"}}


async def test_not_ready_when_the_streams_are_gone(standin, gateway_factory, gateway_bus):
    async with gateway_factory() as client:
        await gateway_bus.js.delete_stream("CODES")
        response = await client.get("/ready")
    assert response.status_code == 503
    assert response.json()["reasons"] == ["stream CODES does not exist: run `voxmesh provision`"]


async def test_api_keys_guard_the_speech_endpoint(standin, gateway_factory):
    standin.plan = Plan(num_chunks=1)
    standin.start_consumer()
    async with gateway_factory(api_keys="secret-1,secret-2") as client:
        missing = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "ryan"})
        wrong = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "ryan"},
                                  headers={"Authorization": "Bearer secret-3"})
        right = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "ryan"},
                                  headers={"Authorization": "Bearer secret-2"})
        health = await client.get("/health")
    assert missing.status_code == wrong.status_code == 401
    # The refusal does not say what was wrong (only the request ids differ).
    assert {**missing.json()["error"], "request_id": None} == {**wrong.json()["error"], "request_id": None}
    assert right.status_code == 200 and health.status_code == 200
    assert len(standin.requests) == 1


def test_settings_default_to_loopback_port_8000():
    settings = GatewaySettings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert service.SETTINGS is GatewaySettings


def test_settings_come_from_flags_and_environment_with_keys_from_a_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alpha,beta\n")
    args = argparse.Namespace(port="9001", host=None)
    settings = resolve(GatewaySettings, args, {"VOXMESH_HOST": "127.0.0.2", "VOXMESH_API_KEYS_FILE": str(keys),
                                                "VOXMESH_REQUEST_DEADLINE_S": "4.5"})
    assert (settings.port, settings.host, settings.request_deadline_s) == (9001, "127.0.0.2", 4.5)
    assert settings.api_keys == "alpha,beta"


@pytest.mark.parametrize(("field", "value", "words"), [
    ("port", 70000, "not a TCP port"),
    ("max_text_chars", 5000, "1..4096"),
    ("request_deadline_s", 0.0, "must be > 0"),
    ("num_partitions", 0, ">= 1"),
])
def test_bad_settings_are_refused_by_name(field, value, words):
    with pytest.raises(SettingsError, match=words) as refused:
        GatewaySettings(**{field: value})
    assert field.replace("_", "-") in str(refused.value)


async def test_gateway_without_a_model_dir_refuses_to_start(gateway_bus):
    from services.gateway.requests.catalog import CatalogError
    from services.gateway.service import serve

    with pytest.raises(CatalogError, match="--model-dir"):
        await serve(GatewaySettings(nats_url=gateway_bus.url), asyncio.Event())


async def test_gateway_answers_micro_service_discovery(gateway_factory, gateway_bus):
    async with gateway_factory():
        reply = await gateway_bus.nc.request(subjects.micro_ping("voxmesh-gateway"), b"", timeout=5)
    info = json.loads(reply.data)
    assert info["name"] == "voxmesh-gateway" and info["metadata"]["replica"] == "gateway-test"


async def test_gateway_with_an_unreadable_config_refuses_to_start(gateway_bus, tmp_path):
    from services.gateway.requests.catalog import CatalogError
    from services.gateway.service import serve

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CatalogError, match="config.json"):
        await serve(GatewaySettings(nats_url=gateway_bus.url, model_dir=str(tmp_path)), asyncio.Event())
