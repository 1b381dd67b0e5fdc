"""vLLM-Omni's and SGLang-Omni's speech body through the real gateway and mesh (`voxmesh up`, tiny checkpoint):
answered 200 with raw PCM as it is made, the same audio as voxmesh's own fields for the same request."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = pytest.mark.timeout(600)

FRAMES = 6  # the tiny model's random weights never stop by themselves: max_new_tokens (a field of both) bounds it
PEER_BODY = {"input": "Hello there.", "voice": "Ryan", "language": "English", "stream": True,
             "non_streaming_mode": False, "response_format": "pcm", "stream_format": "audio",
             "max_new_tokens": FRAMES, "seed": 5}
OWN_BODY = {"input": "Hello there.", "voice": "ryan", "language": "english", "stream_format": "audio",
            "text_mode": "streaming", "response_format": "pcm", "max_new_tokens": FRAMES, "seed": 5}


async def test_the_peer_body_streams_raw_pcm_from_the_mesh(mesh):
    async with httpx.AsyncClient(base_url=mesh.gateway_url, timeout=120) as client:
        async with client.stream("POST", "/v1/audio/speech", json=PEER_BODY) as response:
            pieces = [piece async for piece in response.aiter_raw() if piece]
        own = await client.post("/v1/audio/speech", json=OWN_BODY)
    assert response.status_code == 200, response.headers
    assert response.headers["content-type"] == "audio/pcm" and "content-length" not in response.headers
    assert response.headers["x-sample-rate"] == str(SAMPLE_RATE)
    pcm = b"".join(pieces)
    assert len(pcm) == FRAMES * SAMPLES_PER_FRAME * 2 and np.abs(np.frombuffer(pcm, "<i2")).max() > 0
    assert own.status_code == 200 and own.content == pcm
