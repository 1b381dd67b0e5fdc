"""The web page at `/`: type text, pick a voice, hear it as it streams (services/gateway/static/).

The page's settings (model, voices of the served checkpoint, languages) are written into it as JSON when it is
served, so it needs no other endpoint; the audio comes over the WebSocket `/v1/audio/speech/stream`.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from messages.audio_format import SAMPLE_RATE
from services.gateway.deps import GatewayDep

router = APIRouter()

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
CONFIG_PLACEHOLDER = "{{VOXMESH_CONFIG}}"


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def index(gateway: GatewayDep) -> HTMLResponse:
    """The page, with the served model's voices and languages."""
    catalog = gateway.catalog
    config = {"model": catalog.model, "voices": list(catalog.speakers), "languages": list(catalog.languages),
              "sample_rate": SAMPLE_RATE, "api_key_required": bool(gateway.api_keys),
              "stream_path": "/v1/audio/speech/stream"}
    # "<" escaped: the JSON sits in a <script> element and must not be able to close it.
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    return HTMLResponse(page.replace(CONFIG_PLACEHOLDER, json.dumps(config).replace("<", "\\u003c")))


@router.get("/static/app.js", include_in_schema=False)
async def script() -> FileResponse:
    """The page's player."""
    return FileResponse(STATIC_DIR / "app.js", media_type="text/javascript")
