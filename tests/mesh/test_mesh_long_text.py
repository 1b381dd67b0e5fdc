"""A 4,096-character HTTP input on the real tiny mesh (`voxmesh up`): spoken whole as ordered segments, never cut
short. The response's audio is as long as the segments' frames on CODES add up to; each segment's codes equal that
segment's text spoken alone with the same seed, and its slice of the audio matches that request's audio (within
the codec's batching noise, a few least significant bits), so the order is kept."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from messages.audio_format import SAMPLES_PER_FRAME
from services.gateway.http.segmented_speech import segment_id, split_for_speech
from services.gateway.requests.synthesis import DEFAULT_SEGMENT_CHARS
from tests.support.mesh_client import codes_on_bus

pytestmark = pytest.mark.timeout(300)

BYTES_PER_SAMPLE = 2
BATCHING_NOISE = 16  # int16 steps: the codec decodes concurrent requests in one batch, not bit-identically
FRAMES = 6  # per segment (random weights never stop by themselves)
TEXT = " ".join(f"Line {index} tells the listener something new about the sea and the sky."
                for index in range(80))[:4096]


def body(text: str) -> dict:
    return {"input": text, "voice": "vivian", "seed": 11, "max_new_tokens": FRAMES, "ignore_eos": True,
            "response_format": "pcm"}


async def test_a_4096_character_input_is_spoken_whole_in_order(mesh):
    segments = split_for_speech(TEXT, DEFAULT_SEGMENT_CHARS)
    assert len(TEXT) == 4096 and len(segments) > 5
    async with httpx.AsyncClient(base_url=mesh.gateway_url, timeout=240) as client:
        whole = await client.post("/v1/audio/speech", json=body(TEXT))
        assert whole.status_code == 200, whole.text
        alone = await asyncio.gather(*[client.post("/v1/audio/speech", json=body(text)) for text in segments])
    request_id = whole.headers["x-request-id"]
    frames = [len((await codes_on_bus(mesh.nats_url, segment_id(request_id, k)))[0]) for k in range(len(segments))]
    assert frames == [FRAMES] * len(segments)
    assert len(whole.content) == sum(frames) * SAMPLES_PER_FRAME * BYTES_PER_SAMPLE
    pcm = np.frombuffer(whole.content, dtype=np.int16).astype(np.int32)
    slices = np.split(pcm, len(segments))
    for index, response in enumerate(alone):
        assert response.status_code == 200, response.text
        codes, _ = await codes_on_bus(mesh.nats_url, segment_id(request_id, index))
        np.testing.assert_array_equal(codes, (await codes_on_bus(mesh.nats_url, response.headers["x-request-id"]))[0])
        single = np.frombuffer(response.content, dtype=np.int16).astype(np.int32)
        assert np.abs(slices[index] - single).max() <= BATCHING_NOISE, f"segment {index} is out of place"
    assert all(np.abs(slices[k] - slices[k + 1]).max() > BATCHING_NOISE for k in range(len(segments) - 1))
