"""WebSocket `/v1/audio/speech/stream`: text in as JSON, PCM out as binary frames (see ws_session for the protocol)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from services.gateway.app import GatewayDep
from services.gateway.auth import Unauthorized, check_bearer
from services.gateway.ws_session import SpeechSession

router = APIRouter()

POLICY_VIOLATION = 1008


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket, gateway: GatewayDep) -> None:
    """Authenticate before accepting (close 1008 without a valid key), then serve the session."""
    try:
        check_bearer(websocket.headers.get("authorization"), gateway.api_keys)
    except Unauthorized as error:
        await websocket.close(code=POLICY_VIOLATION, reason=error.message)
        return
    await websocket.accept()
    await SpeechSession(websocket, gateway.synthesizer).run()
