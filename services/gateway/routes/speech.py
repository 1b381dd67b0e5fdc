"""`POST /v1/audio/speech`: OpenAI's speech endpoint (model, input, voice, ...) answering a WAV (or raw PCM).

The whole audio is gathered before the answer, so a request that fails, even after some audio, gets its error
status and an OpenAI-shaped JSON error (a WAV header cannot carry an error).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.gateway.app import Authorized, GatewayDep
from services.gateway.body import SpeechBody, parse_body
from services.gateway.wav import SAMPLE_RATE, wav_bytes

router = APIRouter()

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}


@router.post("/v1/audio/speech")
async def create_speech(request: Request, gateway: GatewayDep, _: Authorized) -> Response:
    """Synthesize `input` and answer the audio with `X-Request-Id`."""
    body = parse_body(await request.body(), SpeechBody)
    pcm = bytearray()
    sample_rate = SAMPLE_RATE
    async with gateway.synthesizer.synthesize(body) as stream:
        async for chunk in stream.chunks():
            pcm += chunk.pcm
            sample_rate = chunk.sample_rate
    payload = wav_bytes(bytes(pcm), sample_rate) if body.response_format == "wav" else bytes(pcm)
    headers = {"X-Request-Id": stream.request_id, "X-Sample-Rate": str(sample_rate)}
    return Response(payload, media_type=MEDIA_TYPES[body.response_format], headers=headers)
