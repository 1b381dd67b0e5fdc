"""The HTTP API against the real mesh (`voxmesh up` with the tiny checkpoint: gateway, decode, vocoder, NATS), with
the official `openai` client: the same seeded request gives the same audio as WAV, PCM, FLAC and SSE; /v1/models
names the checkpoint's fingerprint; every service's /metrics counts the requests."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from services.model.checkpoint_summary import checkpoint_fingerprint
from tests.support.mesh import free_port, run_mesh
from tests.support.http_client import decode_audio, openai_client, parse_sse, read_wav, sample, scrape, sse_audio

pytestmark = pytest.mark.timeout(600)

FRAMES = 6  # the tiny model's random weights never stop by themselves: max_new_tokens sets the length
SEEDED = {"seed": 11, "max_new_tokens": FRAMES, "language": "english"}


@pytest.fixture(scope="module")
def metered_mesh(tiny_checkpoint, tmp_path_factory):
    """The `single` mesh with the decode and vocoder /metrics listeners on (loopback, free ports)."""
    ports = {"decode": free_port(), "vocoder": free_port()}
    env = {"VOXMESH_DECODE_METRICS_PORT": str(ports["decode"]), "VOXMESH_VOCODER_METRICS_PORT": str(ports["vocoder"])}
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("http-mesh-state"), env=env) as mesh:
        yield mesh, ports


async def speak(gateway_url: str, **fields) -> httpx.Response:
    async with openai_client(gateway_url) as client:
        answer = await client.audio.speech.create(model="tiny", voice="ryan", input="The mesh speaks.",
                                                  extra_body=SEEDED, **fields)
    return answer.response


async def test_one_seeded_request_gives_the_same_audio_in_every_format(metered_mesh):
    mesh, _ = metered_mesh
    wav = await speak(mesh.gateway_url, response_format="wav")
    pcm = await speak(mesh.gateway_url, response_format="pcm")
    flac = await speak(mesh.gateway_url, response_format="flac")
    async with openai_client(mesh.gateway_url) as client:
        async with client.audio.speech.with_streaming_response.create(
                model="tiny", voice="ryan", input="The mesh speaks.", response_format="pcm", stream_format="sse",
                extra_body=SEEDED) as stream:
            events = parse_sse(await stream.text())
    rate, channels, width, frames = read_wav(wav.content)
    assert (rate, channels, width) == (SAMPLE_RATE, 1, 2)
    assert len(frames) == FRAMES * SAMPLES_PER_FRAME * 2 and np.abs(np.frombuffer(frames, "<i2")).max() > 0
    assert pcm.content == frames
    flac_rate, flac_samples = decode_audio(flac.content)
    assert flac_rate == SAMPLE_RATE and flac_samples.tobytes() == frames
    assert sse_audio(events) == frames
    done = events[-1]
    assert done["type"] == "speech.audio.done" and (done["frames"], done["stop"]) == (FRAMES, "length")
    assert done["usage"]["output_tokens"] == FRAMES and done["usage"]["input_tokens"] > 0
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + FRAMES
    ids = {wav.headers["x-request-id"], pcm.headers["x-request-id"], flac.headers["x-request-id"], done["request_id"]}
    assert len(ids) == 4


async def test_models_name_the_served_checkpoints_fingerprint(metered_mesh, tiny_checkpoint):
    mesh, _ = metered_mesh
    async with openai_client(mesh.gateway_url) as client:
        [model] = (await client.models.list()).data
    assert model.id == "tiny" and model.model_extra["fingerprint"] == checkpoint_fingerprint(tiny_checkpoint)


async def scrape_all(mesh, ports) -> dict[str, dict]:
    pages = {}
    async with httpx.AsyncClient(timeout=30) as client:
        for service, url in (("gateway", f"{mesh.gateway_url}/metrics"),
                             ("decode", f"http://127.0.0.1:{ports['decode']}/metrics"),
                             ("vocoder", f"http://127.0.0.1:{ports['vocoder']}/metrics")):
            response = await client.get(url)
            assert response.status_code == 200, (service, response.text)
            pages[service] = scrape(response.text)
    return pages


async def test_every_services_metrics_count_the_requests(metered_mesh):
    mesh, ports = metered_mesh
    before = await scrape_all(mesh, ports)
    for _ in range(2):  # the second request's end follows the first one's counters in every service
        await speak(mesh.gateway_url, response_format="pcm")
    after = await scrape_all(mesh, ports)

    def moved(service: str, name: str, **labels: str) -> float:
        return sample(after[service], name, **labels) - sample(before[service], name, **labels)

    finished = {"outcome": "finished", "code": "none"}
    assert moved("gateway", "voxmesh_requests_total", **finished) == 2
    assert moved("gateway", "voxmesh_first_packet_seconds_count") == 2
    assert moved("gateway", "voxmesh_rtf_count") == 2
    assert moved("decode", "voxmesh_requests_total", **finished) >= 1
    assert moved("decode", "voxmesh_frames_total") >= FRAMES
    assert sample(after["decode"], "voxmesh_kv_blocks_capacity") == 512  # compose/single.yml's decode setting
    assert "voxmesh_kv_blocks_in_use" in {name for name, _ in after["decode"]}
    assert "voxmesh_preemptions_total" in {name for name, _ in after["decode"]}
    assert moved("vocoder", "voxmesh_requests_total", **finished) >= 1
    assert moved("vocoder", "voxmesh_audio_chunks_total") >= 2
    assert sample(after["vocoder"], "voxmesh_partitions_owned") == 4
    # Graph captures that fell back to eager are reported (none on the CPU, where nothing is captured).
    assert sample(after["decode"], "voxmesh_graph_capture_failures") == 0
    assert sample(after["vocoder"], "voxmesh_graph_capture_failures") == 0
