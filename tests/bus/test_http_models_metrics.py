"""`GET /v1/models` (with the checkpoint's fingerprint), `GET /v1/audio/voices`, the gateway's `/metrics` moving as
requests run, and the loopback `/metrics` listener the decode and vocoder services use."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from messages.requests import SynthesisRequest
from services.bus.submit import submit_request
from services.decode.settings import DecodeSettings
from services.metrics.listener import metrics_listener
from services.metrics.live import RequestMetrics
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.runtime.settings_schema import SettingsError
from services.vocoder.service import VocoderSettings
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import MODEL, Plan
from tests.support.mesh import free_port
from tests.support.http_client import openai_client, sample, scrape

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


async def test_models_list_the_served_model_with_its_fingerprint(served_gateway, tiny_checkpoint):
    async with served_gateway(model_dir=str(tiny_checkpoint)) as port:
        async with openai_client(f"http://127.0.0.1:{port}") as client:
            listed = await client.models.list()
            one = await client.models.retrieve("tiny")
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.models.retrieve("tts-1")
    [model] = listed.data
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "voxmesh")
    assert model.model_extra["fingerprint"] == checkpoint_fingerprint(tiny_checkpoint)
    assert model.model_extra["voices"] == ["ryan", "vivian", "eric"]
    assert model.model_extra["response_formats"] == ["wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw"]
    assert model.model_extra["sample_rate"] == 24000
    assert model.model_extra["sample_rates"]["opus"] == [8000, 12000, 16000, 24000, 48000]
    assert model.model_extra["sample_rates"]["ulaw"] == [8000, 16000, 22050, 24000, 44100, 48000]
    assert one.model_dump() == model.model_dump()
    assert (unknown.value.status_code, unknown.value.code) == (404, "unknown_model")


async def test_a_gateway_given_config_files_only_has_no_fingerprint(served_gateway):
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        model = (await client.get("/v1/models")).json()["data"][0]
    assert model["id"] == "tiny" and model["fingerprint"] is None


async def test_voices_list_the_speakers_and_languages(served_gateway):
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        voices = (await client.get("/v1/audio/voices")).json()
    assert voices["model"] == "tiny"
    assert [voice["id"] for voice in voices["voices"]] == ["ryan", "vivian", "eric"]
    assert voices["languages"] == ["auto", "english", "chinese", "japanese"]


async def metrics_of(client: httpx.AsyncClient) -> dict:
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return scrape(response.text)


async def test_gateway_metrics_move_as_requests_run(standin, served_gateway):
    standin.start_consumer()
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        before = await metrics_of(client)
        standin.plan = Plan(num_chunks=2)
        assert (await client.post("/v1/audio/speech", json={"input": "One.", "voice": "ryan"})).status_code == 200
        sse = await client.post("/v1/audio/speech", json={"input": "Two.", "voice": "ryan", "stream_format": "sse"})
        assert sse.status_code == 200
        assert (await client.post("/v1/audio/speech", json={"input": "Who?", "voice": "nobody"})).status_code == 400
        assert (await client.post("/v1/audio/speech", content=b"{")).status_code == 400
        standin.plan = Plan(num_chunks=2, fail_after=0)
        assert (await client.post("/v1/audio/speech", json={"input": "Bad.", "voice": "ryan"})).status_code == 500
        after = await metrics_of(client)
    moved = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    requests = "voxmesh_requests_total"
    assert sample(moved, requests, outcome="finished", code="none") == 2
    assert sample(moved, requests, outcome="refused", code="unknown_voice") == 1
    assert sample(moved, requests, outcome="refused", code="invalid_json") == 1
    assert sample(moved, requests, outcome="failed", code="model_error") == 1
    assert sample(moved, "voxmesh_first_packet_seconds_count") == 2  # the failed one never had audio
    assert sample(moved, "voxmesh_rtf_count") == 2 and sample(after, "voxmesh_rtf_sum") > 0
    assert sample(after, "voxmesh_active_streams") == 0


async def test_gateway_metrics_show_active_streams_and_queue_depth(standin, served_gateway, gateway_bus):
    for index in range(2):  # queued while no decode replica pulls
        await submit_request(gateway_bus.js, SynthesisRequest(id=f"waiting{index}", model=MODEL, text="wait",
                                                              speaker="ryan", created_at=time.time()))
    async with served_gateway() as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        queued = await metrics_of(client)
        standin.plan = Plan(num_chunks=3, hang_after=1)  # one chunk, then the request stays in flight
        standin.start_consumer()
        body = {"input": "Hold on.", "voice": "ryan", "stream_format": "audio", "response_format": "pcm"}
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            pieces = response.aiter_bytes()  # kept: a dropped iterator would close the response
            await anext(pieces)  # its first audio is out: the request is streaming
            streaming = await metrics_of(client)
    assert sample(queued, "voxmesh_queue_depth") == 2
    assert sample(streaming, "voxmesh_active_streams") == 1


async def test_metrics_listener_serves_only_metrics_on_loopback():
    metrics = RequestMetrics()
    metrics.count("finished")
    async with metrics_listener(metrics.registry, 0) as off:
        assert off is None
    async with metrics_listener(metrics.registry, free_port()) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            page = await client.get("/metrics")
            other = await client.get("/")
            post = await client.post("/metrics")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"garbage\r\n\r\n")  # a malformed request is dropped, the listener serves on
        await writer.drain()
        assert await reader.read() == b""
        writer.close()
        async with httpx.AsyncClient() as client:
            again = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert sample(scrape(page.text), "voxmesh_requests_total", outcome="finished", code="none") == 1
    assert (other.status_code, post.status_code, again.status_code) == (404, 405, 200)


@pytest.mark.parametrize("settings", [DecodeSettings, VocoderSettings])
def test_metrics_port_is_a_checked_setting(settings):
    assert settings().metrics_port == 0  # off unless asked for
    with pytest.raises(SettingsError, match="metrics-port"):
        settings(metrics_port=70000)


@pytest.mark.parametrize("settings", [DecodeSettings, VocoderSettings])
def test_metrics_listen_on_loopback_unless_another_address_is_set(settings):
    assert settings().metrics_host == "127.0.0.1"


async def test_metrics_listener_binds_the_address_it_is_given():
    metrics = RequestMetrics()
    async with metrics_listener(metrics.registry, free_port(), host="127.0.0.2") as port:
        async with httpx.AsyncClient() as client:
            there = await client.get(f"http://127.0.0.2:{port}/metrics")
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/metrics")
    assert there.status_code == 200
