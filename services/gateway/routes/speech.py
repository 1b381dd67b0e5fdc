"""`POST /v1/audio/speech`: OpenAI's speech endpoint (model, input, voice, ...) answering a WAV (or raw PCM).

The whole audio is gathered before the answer (streamed formats come with the full OpenAI API), so a request that
fails, even after some audio, gets its error status and an OpenAI-shaped JSON error (a WAV header cannot carry an
error). A client that hangs up meanwhile is noticed at once, so the supervisor can cancel its request.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.gateway.app import Authorized, GatewayDep
from services.gateway.body import SpeechBody, parse_body
from services.gateway.stream import AudioStream
from services.gateway.wav import SAMPLE_RATE, wav_bytes

router = APIRouter()

CLIENT_CLOSED_REQUEST = 499  # never seen by the client; for logs
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}


@router.post("/v1/audio/speech")
async def create_speech(request: Request, gateway: GatewayDep, _: Authorized) -> Response:
    """Synthesize `input` and answer the audio with `X-Request-Id`."""
    body = parse_body(await request.body(), SpeechBody)
    async with gateway.synthesizer.synthesize(body) as stream:
        collected = await _unless_client_leaves(request, _collect(stream))
    headers = {"X-Request-Id": stream.request_id}
    if collected is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=headers)
    pcm, sample_rate = collected
    payload = wav_bytes(pcm, sample_rate) if body.response_format == "wav" else pcm
    headers["X-Sample-Rate"] = str(sample_rate)
    return Response(payload, media_type=MEDIA_TYPES[body.response_format], headers=headers)


async def _collect(stream: AudioStream) -> tuple[bytes, int]:
    """All of the request's PCM and its sample rate (RequestFailed after a `failed` terminal)."""
    pcm = bytearray()
    sample_rate = SAMPLE_RATE
    async for chunk in stream.chunks():
        pcm += chunk.pcm
        sample_rate = chunk.sample_rate
    return bytes(pcm), sample_rate


async def _unless_client_leaves(request: Request, work):
    """`work`'s result, or None when the client disconnects first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
    if task.cancelled():
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read, so receive() only reports that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
