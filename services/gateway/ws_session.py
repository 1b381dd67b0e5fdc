"""One WebSocket session of `/v1/audio/speech/stream`.

Protocol (grows into issue 6's): the client sends a JSON text message with the speech fields
(`{"input": "...", "voice": "...", ...}`, as `POST /v1/audio/speech` takes them); the server answers
`{"type": "audio.start", ...}`, then binary frames of s16le mono PCM in order, then `{"type": "audio.done", ...}`,
or `{"type": "error", ...}` (after the audio made so far, if a request fails mid-stream). A bad message gets an
`error` event and the socket stays open; requests on one socket are served one after another.

A receiver and a sender run in one TaskGroup: when the client disconnects, the receiver ends the session, which
cancels the request being streamed (the supervisor then cancels it in the mesh after the resume window).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect

from messages.errors import ErrorCode
from services.gateway.body import SynthesisFields, parse_body
from services.gateway.errors import GatewayError
from services.gateway.stream import AudioStream
from services.gateway.synthesis import Synthesizer
from services.gateway.wav import SAMPLE_RATE

log = logging.getLogger(__name__)

PCM_FORMAT = "pcm_s16le"
_INVALID = ErrorCode.INVALID_REQUEST


class ClientGone(Exception):
    """The client closed the socket."""


class SpeechSession:
    """Serves one accepted WebSocket until the client leaves."""

    def __init__(self, websocket: WebSocket, synthesizer: Synthesizer, max_queued: int = 8) -> None:
        self._ws = websocket
        self._synthesizer = synthesizer
        self._requests: asyncio.Queue[SynthesisFields] = asyncio.Queue(max_queued)
        self._send_lock = asyncio.Lock()  # the receiver's error events and the sender's audio share the socket

    async def run(self) -> None:
        """Until the client disconnects."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(), name="ws-receive")
                group.create_task(self._serve(), name="ws-serve")
        except* (ClientGone, WebSocketDisconnect, OSError):  # OSError: a send to a socket already gone
            log.debug("websocket client left")

    async def _receive(self) -> None:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                raise ClientGone()
            text = message.get("text")
            if text is None:
                await self._send_error(GatewayError(_INVALID, "send JSON text messages, not binary"))
                continue
            try:
                fields = parse_body(text, SynthesisFields)
            except GatewayError as error:
                await self._send_error(error)
                continue
            if self._requests.full():
                await self._send_error(GatewayError(_INVALID, f"at most {self._requests.maxsize} requests may "
                                                              "wait on one socket; wait for audio.done"))
                continue
            self._requests.put_nowait(fields)

    async def _serve(self) -> None:
        while True:
            fields = await self._requests.get()
            try:
                async with self._synthesizer.synthesize(fields) as stream:
                    await self._stream_audio(stream)
            except GatewayError as error:
                await self._send_error(error)

    async def _stream_audio(self, stream: AudioStream) -> None:
        await self._send_json({"type": "audio.start", "request_id": stream.request_id, "format": PCM_FORMAT,
                               "sample_rate": SAMPLE_RATE, "channels": 1})
        samples = 0
        sample_rate = SAMPLE_RATE
        async for chunk in stream.chunks():
            async with self._send_lock:
                await self._ws.send_bytes(chunk.pcm)
            samples += chunk.num_samples
            sample_rate = chunk.sample_rate
        terminal = stream.terminal
        await self._send_json({"type": "audio.done", "request_id": stream.request_id,
                               "chunk_count": stream.next_seq, "samples": samples,
                               "duration_s": samples / sample_rate,
                               "frames": getattr(terminal, "frames", None), "stop": getattr(terminal, "stop", None)})

    async def _send_error(self, error: GatewayError) -> None:
        await self._send_json({"type": "error", "request_id": error.request_id, "code": error.code.value,
                               "message": error.message, "param": error.param, "stage": error.stage.value})

    async def _send_json(self, event: dict) -> None:
        async with self._send_lock:
            await self._ws.send_json(event)

