"""The client side of `POST /v1/audio/speech` with raw PCM streamed as it is made: the public open-loop method's
transport, beside the WebSocket (client.py).

The request is the WebSocket's speech fields plus STREAMED_PCM_FIELDS; the answer is `200 audio/pcm` whose body is
s16le mono 24 kHz PCM in chunked transfer (the status waits for the first audio), or an error status with an
OpenAI-shaped JSON body. A failure after the first audio cuts the connection before the body's end, so a body that
ends early, or mid-sample, is an incomplete request. `HttpSpeechClient.request` times every body piece into the
same `StreamRecord` the WebSocket client makes, so the metrics are the same code for both transports.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from urllib.parse import urlsplit, urlunsplit

import httpx

from loadtest.bench.audible import PcmScanner
from loadtest.bench.client import TargetError, is_loopback_host, stream_url
from loadtest.bench.metrics import ChunkArrival, StreamError, StreamRecord
from messages.audio_format import SAMPLE_RATE

SPEECH_PATH = "/v1/audio/speech"
STREAMED_PCM_FIELDS: dict = {"stream": True, "response_format": "pcm", "stream_format": "audio"}
"""The fields that ask the speech endpoint for raw PCM as it is made, as public clients of other Qwen3-TTS servers
send them (`stream: true` and `stream_format: "audio"` mean the same here)."""
_ERROR_BODY_LIMIT = 64 * 1024
_REQUEST_SENT = "http11.send_request_body.complete"  # httpcore's trace event once the body is written


def speech_url(gateway_url: str, *, allow_remote: bool = False) -> str:
    """The speech endpoint of a gateway given as `http://host:port` (with or without the path). Raises TargetError
    for a URL that is not http(s), or a non-loopback host unless `allow_remote`."""
    parts = urlsplit(gateway_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError("invalid_url", f"{gateway_url!r} is not a gateway URL: use http://127.0.0.1:PORT")
    if not allow_remote and not is_loopback_host(parts.hostname):
        raise TargetError("not_loopback", f"refusing to load-test {parts.hostname}: only loopback gateways "
                                          "(127.0.0.0/8, ::1, localhost) unless you pass --allow-remote")
    path = parts.path.rstrip("/")
    if not path.endswith(SPEECH_PATH):
        path += SPEECH_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def speech_body(payload: dict) -> dict:
    """The HTTP body for the WebSocket's speech fields `payload`."""
    return {**payload, **STREAMED_PCM_FIELDS}


class _BodyRecorder:
    """One response's timeline: every body piece's whole samples, then how it ended."""

    def __init__(self, index: int, prompt_id: str, started_at: float) -> None:
        self.index, self.prompt_id, self.started_at = index, prompt_id, started_at
        self.sent_at: float | None = None
        self.request_id: str | None = None
        self.scanner = PcmScanner()
        self.chunks: list[ChunkArrival] = []
        self.error: StreamError | None = None
        self.ended_at: float | None = None

    def feed(self, data: bytes, at: float) -> None:
        self.chunks.append(ChunkArrival(at=at, num_samples=self.scanner.feed(data, at)))

    def end(self, at: float, error: StreamError | None = None) -> None:
        if self.ended_at is None:
            self.ended_at, self.error = at, error

    def record(self) -> StreamRecord:
        return StreamRecord(index=self.index, prompt_id=self.prompt_id, started_at=self.started_at,
                            sent_at=self.sent_at, ended_at=self.ended_at, chunks=tuple(self.chunks),
                            sample_rate=SAMPLE_RATE, request_id=self.request_id, error=self.error,
                            first_byte_at=self.scanner.first_byte_at, first_audible=self.scanner.first_audible)


class HttpSpeechClient:
    """One connection pool for a whole bench run (a client per request would spend milliseconds of CPU on each);
    connections are opened as concurrency needs them and never through a proxy from the environment."""

    def __init__(self, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(headers=headers, limits=limits, timeout=None, trust_env=False)

    async def __aenter__(self) -> HttpSpeechClient:
        return self

    async def __aexit__(self, *_exc) -> None:
        await self._client.aclose()

    async def request(self, url: str, payload: dict, *, index: int = 0, prompt_id: str = "",
                      timeout_s: float = 120.0) -> StreamRecord:
        """POST `payload` (the speech fields; STREAMED_PCM_FIELDS are added) and time the body to its end. Never
        raises for the server's or the network's failures: they end up in the record's `error` (client-side
        codes: connect_failed, client_timeout, connection_closed, incomplete_audio, protocol_error)."""
        recorder = _BodyRecorder(index, prompt_id, perf_counter())
        try:
            async with asyncio.timeout(timeout_s):
                await self._exchange(url, speech_body(payload), recorder)
        except TimeoutError:
            recorder.end(perf_counter(), StreamError("client_timeout", f"no end of body within {timeout_s:.1f} s"))
        except httpx.ConnectError as exc:
            recorder.end(perf_counter(), StreamError("connect_failed", f"cannot open {url}: {exc}"))
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            recorder.end(perf_counter(), StreamError("connection_closed", f"the body ended early: {exc}"))
        except httpx.HTTPError as exc:
            recorder.end(perf_counter(), StreamError("connect_failed", f"{type(exc).__name__}: {exc}"))
        return recorder.record()

    async def _exchange(self, url: str, body: dict, recorder: _BodyRecorder) -> None:
        async def trace(event: str, _info: dict) -> None:
            if event == _REQUEST_SENT:
                recorder.sent_at = perf_counter()

        async with self._client.stream("POST", url, json=body, extensions={"trace": trace}) as response:
            recorder.request_id = response.headers.get("x-request-id")
            if response.status_code != 200:
                recorder.end(perf_counter(), await _error_of(response))
                return
            media = response.headers.get("content-type", "")
            if not media.startswith("audio/pcm"):
                recorder.end(perf_counter(), StreamError("protocol_error", f"expected audio/pcm, got {media!r}"))
                return
            async for piece in response.aiter_raw():
                recorder.feed(piece, perf_counter())
        if recorder.scanner.has_partial_sample:
            recorder.end(perf_counter(), StreamError("incomplete_audio", "the body ended in the middle of a sample"))
        recorder.end(perf_counter())


async def _error_of(response: httpx.Response) -> StreamError:
    """The gateway's OpenAI-shaped error (`{"error": {"code", "message", "stage"}}`) with the HTTP status."""
    raw = b""
    async for piece in response.aiter_raw():
        raw += piece
        if len(raw) > _ERROR_BODY_LIMIT:
            break
    fallback = f"http_{response.status_code}"
    try:
        error = json.loads(raw)["error"]
        return StreamError(code=str(error.get("code") or fallback), message=str(error.get("message", "")),
                           stage=error.get("stage"), http_status=response.status_code)
    except (ValueError, TypeError, KeyError, AttributeError):
        return StreamError(code=fallback, message=raw[:200].decode(errors="replace"), http_status=response.status_code)


def endpoint_url(gateway_url: str, transport: str, *, allow_remote: bool = False) -> str:
    """The URL a `transport` (`websocket` or `http`) target is reached at, from the gateway's `http://host:port`."""
    if transport == "http":
        return speech_url(gateway_url, allow_remote=allow_remote)
    return stream_url(gateway_url, allow_remote=allow_remote)
