"""The web page at `/`: type text, pick a voice (or clone one), hear it as it streams, see its waveform, download
it (services/gateway/static/).

The page's settings (model, voices of the served checkpoint, languages) are written into it as JSON when it is
served; the audio comes over the WebSocket `/v1/audio/speech/stream`. A base model's page lists and saves cloned
voices through `/v1/audio/voices` and sends a reference file as the request's `ref_audio`.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode
from services.gateway.deps import GatewayDep
from services.gateway.errors import GatewayError
from services.gateway.requests.response_formats import audio_format, available_formats

router = APIRouter()

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
CONFIG_PLACEHOLDER = "{{VOXMESH_CONFIG}}"
SCRIPTS = ("app", "recording", "voices", "waveform", "formats")
"""The page's scripts, /static/<name>.js: the player and session, the kept PCM and its WAV, cloned voices, the
waveform, the format and rate picker."""


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def index(gateway: GatewayDep) -> HTMLResponse:
    """The page, with the served model's voices and languages."""
    catalog = gateway.catalog
    formats = available_formats()
    config = {"model": catalog.model, "voices": list(catalog.speakers), "languages": list(catalog.languages),
              "sample_rate": SAMPLE_RATE, "api_key_required": not gateway.keyring.is_open,
              "stream_path": "/v1/audio/speech/stream", "model_type": catalog.model_type,
              "voices_path": "/v1/audio/voices", "speech_path": "/v1/audio/speech",
              "response_formats": list(formats),
              "sample_rates": {name: list(audio_format(name).rates) for name in formats}}
    # "<" escaped: the JSON sits in a <script> element and must not be able to close it.
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    return HTMLResponse(page.replace(CONFIG_PLACEHOLDER, json.dumps(config).replace("<", "\\u003c")))


@router.get("/static/{name}.js", include_in_schema=False)
async def script(name: str) -> FileResponse:
    """One of the page's scripts (only those: the name never reaches the file system otherwise)."""
    if name not in SCRIPTS:
        raise GatewayError(ErrorCode.NOT_FOUND, f"no script {name}.js", status=404)
    return FileResponse(STATIC_DIR / f"{name}.js", media_type="text/javascript")
