"""WebSocket `/v1/audio/speech/stream`: incremental text in, PCM out as it is made, resume and cancel (the messages
are in ws/protocol.py, the session in ws/session.py).

API keys are checked before the socket is accepted (close 1008 without a valid one): in the `Authorization: Bearer`
header, or, for browsers (which cannot set headers on a WebSocket), as the subprotocol `bearer.<key>` offered beside
`voxmesh`, which the server then selects.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from services.gateway.deps import GatewayDep, ResumeRegistryDep
from services.gateway.http.auth import Unauthorized
from services.gateway.http.routes import web
from services.gateway.ws.session import SpeechSession

router = APIRouter()
router.include_router(web.router)  # the page that plays this stream

POLICY_VIOLATION = 1008
SUBPROTOCOL = "voxmesh"
BEARER_PREFIX = "bearer."


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket, gateway: GatewayDep, registry: ResumeRegistryDep) -> None:
    """Authenticate before accepting (close 1008 without a valid key), then serve the session."""
    offered = list(websocket.scope.get("subprotocols") or [])
    try:
        tenant = gateway.keyring.authenticate(_authorization(websocket, offered))
    except Unauthorized as error:
        await websocket.close(code=POLICY_VIOLATION, reason=error.message)
        return
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    await SpeechSession(websocket, gateway.synthesizer, registry, gateway.resume_tokens, tenant=tenant).run()


def _authorization(websocket: WebSocket, offered: list[str]) -> str | None:
    """The Authorization header, or the same built from a `bearer.<key>` subprotocol."""
    header = websocket.headers.get("authorization")
    if header is not None:
        return header
    key = next((p[len(BEARER_PREFIX):] for p in offered if p.startswith(BEARER_PREFIX)), None)
    return None if key is None else f"Bearer {key}"
