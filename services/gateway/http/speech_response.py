"""The HTTP response of one `POST /v1/audio/speech`: it runs the request and delivers its audio in one of three ways.

- whole (no `stream_format`): the complete file once the audio is all there, with its exact length; a request that
  fails, even after some audio, answers its error status and an OpenAI-shaped JSON error instead.
- `audio`: the file's bytes as they are made (chunked transfer). The status and headers wait for the first audio,
  so every failure before it is an ordinary HTTP error. A failure after it cuts the connection before the final
  chunk (raw bytes cannot carry an error): clients see an incomplete body; use `sse` to receive the error itself.
- `sse`: server-sent events (sse.py); a failure after the first audio is an `error` event, and the stream ends.

The request runs in a task raced against the client's disconnect: a client that hangs up cancels it at once (the
synthesizer then tells the supervisor, which cancels it in the mesh after the resume window).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from messages.audio_format import SAMPLE_RATE
from messages.events import Finished
from services.gateway.errors import GatewayError
from services.gateway.http import sse
from services.gateway.http.encoders import StreamEncoder, encode_whole, stream_encoder
from services.gateway.http.segmented_speech import SegmentedStream, speech_stream
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.body import SpeechBody
from services.gateway.requests.response_formats import AudioFormat, audio_format, served_rate
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.tenancy.tenant import Tenant

log = logging.getLogger(__name__)

# Codecs worth keeping off the event loop for a whole file (so is resampling: see _send_whole).
_WHOLE_IN_THREAD = ("flac", "mp3", "opus", "aac")


class SpeechResponse(Response):
    """Runs one admitted-on-call speech request and sends its audio (see the module's docstring)."""

    def __init__(self, synthesizer: Synthesizer, body: SpeechBody, request_id: str | None,
                 tenant: Tenant | None = None) -> None:
        super().__init__()
        self._synthesizer = synthesizer
        self._tenant = tenant
        self._body = body
        self._request_id = request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = asyncio.ensure_future(self._run(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait([run, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not run.done():
                run.cancel()
            await asyncio.gather(gone, return_exceptions=True)
            with contextlib.suppress(asyncio.CancelledError):
                await run  # a cancelled run (the client left) is the normal end; any other error propagates

    async def _run(self, send: Send) -> None:
        delivery = _Delivery(send, self._body, self._request_id)
        try:
            async with speech_stream(self._synthesizer, self._body, self._request_id, self._tenant) as stream:
                await delivery.run(stream)
        except GatewayError as error:
            await delivery.fail(error)


class _Delivery:
    """Sends one request's audio in the body's mode; knows whether the response has started."""

    def __init__(self, send: Send, body: SpeechBody, request_id: str | None) -> None:
        self._send = send
        self._mode = body.stream_format
        self._format_name = body.response_format
        self._requested_rate = body.sample_rate
        self._format: AudioFormat | None = None  # looked up once admitted: admission refuses unknown formats
        self._encoder: StreamEncoder | None = None
        self._sample_rate = SAMPLE_RATE  # the model's audio's
        self._out_rate = SAMPLE_RATE  # the answer's (X-Sample-Rate)
        self._num_samples = 0
        self._request_id = request_id or ""
        self.is_started = False

    async def run(self, stream: AudioStream | SegmentedStream) -> None:
        """Deliver the whole request; GatewayError from the stream propagates (to `fail`)."""
        self._request_id = stream.request_id
        self._format = audio_format(self._format_name)
        self._out_rate = served_rate(self._format, self._requested_rate)
        if self._mode is None:
            await self._send_whole(stream)
            return
        async for chunk in stream.chunks():
            if self._encoder is None:
                self._sample_rate = chunk.sample_rate
                self._encoder = stream_encoder(self._format, chunk.sample_rate, self._out_rate)
            self._num_samples += chunk.num_samples
            await self._send_piece(self._encoder.feed(chunk.pcm))
        encoder = self._encoder or stream_encoder(self._format, self._sample_rate, self._out_rate)
        await self._send_piece(encoder.finish())
        if self._mode == "sse":
            finished = stream.terminal if isinstance(stream.terminal, Finished) else None
            await self._body_part(sse.done_event(stream.request_id, finished, num_samples=self._num_samples,
                                                 sample_rate=self._sample_rate))
        await self._body_part(b"", more=False)

    async def fail(self, error: GatewayError) -> None:
        """Answer `error`: as the response if none started, else as the stream's end (see the module)."""
        if error.request_id is None:  # refused before admission: the HTTP request's own id
            error.request_id = self._request_id or None
        if not self.is_started:
            payload = json.dumps(error.body()).encode()
            headers = {**error.headers(), "Content-Type": "application/json", "Content-Length": str(len(payload))}
            await self._send_start(error.status, headers)
            await self._body_part(payload, more=False)
            return
        if self._mode == "sse":
            await self._body_part(sse.error_event(error))
            await self._body_part(b"", more=False)
            return
        log.warning("request failed after its audio started (%s: %s); cutting the stream so the client sees an "
                    "incomplete body", error.code.value, error.message)

    async def _send_whole(self, stream: AudioStream | SegmentedStream) -> None:
        pcm = bytearray()
        async for chunk in stream.chunks():
            pcm += chunk.pcm
            self._sample_rate = chunk.sample_rate
        if self._format.name in _WHOLE_IN_THREAD or self._out_rate != self._sample_rate:
            data = await asyncio.to_thread(encode_whole, self._format, bytes(pcm), self._sample_rate, self._out_rate)
        else:
            data = encode_whole(self._format, bytes(pcm), self._sample_rate, self._out_rate)
        await self._start({"Content-Length": str(len(data))})
        await self._body_part(data, more=False)

    async def _send_piece(self, data: bytes) -> None:
        """Start the response at the first audio, then send `data` (as an SSE delta in sse mode)."""
        if not self.is_started:
            await self._start({})
        if data:
            await self._body_part(sse.delta_event(data) if self._mode == "sse" else data)

    async def _start(self, extra: dict[str, str]) -> None:
        media_type = sse.MEDIA_TYPE if self._mode == "sse" else self._format.media_type
        headers = {"Content-Type": media_type, "X-Request-Id": self._request_id,
                   "X-Sample-Rate": str(self._out_rate), **extra}
        if self._format.raw_bits is not None:  # a headerless format: what a player needs besides the rate
            headers.update({"X-Channels": "1", "X-Bit-Depth": str(self._format.raw_bits)})
        if self._mode is not None:
            headers["Cache-Control"] = "no-cache"
        await self._send_start(200, headers)
        self.is_started = True

    async def _send_start(self, status: int, headers: dict[str, str]) -> None:
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        await self._send({"type": "http.response.start", "status": status, "headers": raw})

    async def _body_part(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


async def _disconnected(receive: Receive) -> None:
    """Returns when the client hangs up (the body has been read, so receive() only reports that)."""
    while (await receive())["type"] != "http.disconnect":
        pass

