"""Saved voices of a base (voice-cloning) model: `POST /v1/audio/voices` computes one from reference audio and
keeps it in the VOICES object store (every gateway and decode replica on any host sees it, and it outlives
restarts), `DELETE /v1/audio/voices/{name}` removes it; `GET /v1/audio/voices` (routes/models.py) lists them. A
speech request naming a saved voice as its `voice` skips the audio work altogether.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from messages.errors import ErrorCode
from services.gateway.deps import Authorized, GatewayDep
from services.gateway.errors import AdmissionError, GatewayError
from services.gateway.http.openapi import VOICE_BODY, error_responses
from services.gateway.requests.body import validation_error
from services.gateway.requests.voice_body import VoiceBody
from services.gateway.gateway import Gateway

router = APIRouter()

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def voice_object(name: str, revision: str | None, created: str | None, mode: str | None) -> dict:
    return {"id": name, "name": name, "object": "voice", "saved": True, "mode": mode, "revision": revision,
            "created": created}


def checked_name(name: str) -> str:
    lowered = name.strip().lower()
    if not _NAME.match(lowered):
        raise AdmissionError(ErrorCode.INVALID_VALUE, f"voice name {name!r}: use 1-64 of letters, digits, '_' and "
                             "'-', starting with a letter or digit", param="name")
    return lowered


def _require_cloning(gateway: Gateway) -> None:
    if gateway.catalog.model_type != "base":
        raise AdmissionError(ErrorCode.VOICE_CLONING_UNSUPPORTED, f"this {gateway.catalog.model_type} model cannot "
                             "clone voices: saved voices need a base model", param="audio")
    if gateway.synthesizer.voices is None:
        raise GatewayError(ErrorCode.INTERNAL, "voice cloning is not set up on this gateway", status=503)


@router.post("/v1/audio/voices", status_code=201, openapi_extra=VOICE_BODY,
             responses={201: {"description": "The saved voice."}, **error_responses(400, 401, 503, 504)})
async def create_voice(request: Request, gateway: GatewayDep, _: Authorized) -> JSONResponse:
    """Compute a voice from reference audio, once, and save it under `name`."""
    try:
        body = msgspec.json.decode(await request.body(), type=VoiceBody)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, "body") from exc
    except msgspec.DecodeError as exc:
        raise AdmissionError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from exc
    name = checked_name(body.name)
    _require_cloning(gateway)
    if not body.x_vector_only_mode and not (body.ref_text or "").strip():
        raise AdmissionError(ErrorCode.REF_TEXT_REQUIRED, "in-context cloning needs ref_text, the transcript of "
                             "audio; or set x_vector_only_mode to keep the voice alone", param="ref_text")
    created = await gateway.synthesizer.voices.create(
        name, body.audio, None if body.x_vector_only_mode else body.ref_text, body.x_vector_only_mode)
    mode = "x-vector" if body.x_vector_only_mode else "in-context"
    created_at = datetime.now(timezone.utc).isoformat()
    answer = voice_object(name, created.revision, created_at, mode) | {"reference_frames": created.num_ref_frames}
    return JSONResponse(answer, status_code=201)


@router.delete("/v1/audio/voices/{name}", responses={200: {"description": "The voice was deleted."},
                                                     **error_responses(401, 404)})
async def delete_voice(name: str, gateway: GatewayDep, _: Authorized) -> dict:
    """Delete a saved voice; requests already admitted with it may still finish in it."""
    voices = gateway.synthesizer.voices
    if voices is None or not await voices.delete(name.strip().lower()):
        raise GatewayError(ErrorCode.UNKNOWN_VOICE, f"no saved voice {name!r}", param="name", status=404)
    return {"id": name.strip().lower(), "object": "voice", "deleted": True}
