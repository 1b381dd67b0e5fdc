"""The sending side of a streaming WebSocket, shared by the session's receiver (events, errors) and its player
(audio): one message at a time, so a JSON event never lands inside another send."""

from __future__ import annotations

import asyncio
import base64

from starlette.websockets import WebSocket

from services.gateway.errors import GatewayError
from services.gateway.ws.protocol import BASE64_FORMAT, AudioDelta, ErrorEvent, ServerEvent, encode_event


class ClientChannel:
    """Sends events and audio to one client."""

    def __init__(self, websocket: WebSocket) -> None:
        self._ws = websocket
        self._lock = asyncio.Lock()

    async def event(self, event: ServerEvent) -> None:
        """A JSON event."""
        async with self._lock:
            await self._ws.send_text(encode_event(event))

    async def error(self, error: GatewayError) -> None:
        """An `error` event; the socket stays open."""
        await self.event(ErrorEvent(request_id=error.request_id, code=error.code, message=error.message,
                                    param=error.param, stage=error.stage))

    async def audio(self, audio_format: str, request_id: str, seq: int, data: bytes) -> None:
        """The bytes of chunk `seq` in the socket's format: a binary frame, or an `audio.delta` event carrying them
        in base64."""
        if audio_format == BASE64_FORMAT:
            await self.event(AudioDelta(request_id=request_id, seq=seq, audio=base64.b64encode(data).decode()))
            return
        await self.binary(data)

    async def binary(self, data: bytes) -> None:
        """A binary frame."""
        async with self._lock:
            await self._ws.send_bytes(data)

    async def close(self, code: int, reason: str = "") -> None:
        """Close the socket (after any send in progress)."""
        async with self._lock:
            await self._ws.close(code=code, reason=reason)
