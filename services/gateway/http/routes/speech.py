"""`POST /v1/audio/speech`: OpenAI's speech endpoint (model, input, voice, instructions, response_format, speed,
stream_format) plus voxmesh's extras (language, seed, sampling, frame limits, first-chunk size, text mode) and the
fields of vLLM-Omni's and SGLang-Omni's bodies (stream, non_streaming_mode, task_type...: requests/peer_fields.py).

The answer is a whole file, a byte stream or server-sent events (speech_response.py says how each reports a
failure); `X-Request-Id` names the request on every answer, errors included.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.gateway.deps import Authorized, GatewayDep
from services.gateway.errors import GatewayError
from services.gateway.http.openapi import SPEECH_BODY, SPEECH_RESPONSES
from services.gateway.http.request_id import request_id_of
from services.gateway.http.speech_response import SpeechResponse
from services.gateway.requests.body import SpeechBody, parse_body
from services.gateway.requests.peer_fields import resolved

router = APIRouter()


@router.post("/v1/audio/speech", response_class=Response, openapi_extra=SPEECH_BODY, responses=SPEECH_RESPONSES)
async def create_speech(request: Request, gateway: GatewayDep, tenant: Authorized) -> Response:
    """Synthesize `input`; the request runs under the HTTP request's id."""
    try:
        parsed = parse_body(await request.body(), SpeechBody)
        body = resolved(parsed, gateway.synthesizer.admission.catalog)
    except GatewayError as error:
        gateway.synthesizer.metrics.refused(error)
        raise
    return SpeechResponse(gateway.synthesizer, body, request_id_of(request), tenant)
