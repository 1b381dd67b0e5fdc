"""The client side of `POST /v1/audio/speech` with raw PCM streamed as it is made: the public open-loop method's
transport, beside the WebSocket (client.py).

The request is the WebSocket's speech fields plus STREAMED_PCM_FIELDS; the answer is `200 audio/pcm` whose body is
s16le mono PCM in chunked transfer (the status waits for the first audio) at the rate `X-Sample-Rate` says (24 kHz
unless the request's `sample_rate` asks another), or an error status with an OpenAI-shaped JSON body. A failure after
the first audio cuts the connection before the body's end, so a body that ends early, or mid-sample, is an
incomplete request. `HttpSpeechClient.request` times every body piece into the same `StreamRecord` the WebSocket
client makes, so the metrics are the same code for both transports.

Another `response_format` (wav, flac, mp3, aac, opus, ulaw, alaw) is asked for by `streamed_fields`; its body is
decoded piece by piece as it arrives (decoded_scanner.py), so first audio and underruns are measured on the samples
a player could have played by then, counted at the rate they were decoded at. The answer's rate must be the one
asked (`rate_mismatch` otherwise), and a stream whose own header says another rate than `X-Sample-Rate` is a
`protocol_error`.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from urllib.parse import urlsplit, urlunsplit

import httpx

from loadtest.bench.audible import PcmScanner
from loadtest.bench.audio_decode import G711_FORMATS, AudioDecodeError
from loadtest.bench.client import TargetError, is_loopback_host, stream_url
from loadtest.bench.decoded_scanner import DecodedScanner
from loadtest.bench.metrics import ChunkArrival, StreamError, StreamRecord
from messages.audio_format import SAMPLE_RATE

SPEECH_PATH = "/v1/audio/speech"
STREAMED_PCM_FIELDS: dict = {"stream": True, "response_format": "pcm", "stream_format": "audio"}
"""The fields that ask the speech endpoint for raw PCM as it is made, as public clients of other Qwen3-TTS servers
send them (`stream: true` and `stream_format: "audio"` mean the same here)."""
MEDIA_TYPES = {"pcm": ("audio/pcm",), "wav": ("audio/wav", "audio/x-wav"), "flac": ("audio/flac",),
               "mp3": ("audio/mpeg",), "aac": ("audio/aac",), "opus": ("audio/ogg", "audio/opus"),
               "ulaw": ("audio/basic",), "alaw": ("audio/x-alaw-basic",)}
"""The Content-Types an answer in each `response_format` may have."""
G711_RATE = 8000
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


def streamed_fields(response_format: str = "pcm") -> dict:
    """The fields that ask for `response_format` as it is made (STREAMED_PCM_FIELDS for pcm)."""
    return {**STREAMED_PCM_FIELDS, "response_format": response_format}


def speech_body(payload: dict, response_format: str = "pcm") -> dict:
    """The HTTP body for the WebSocket's speech fields `payload`."""
    return {**payload, **streamed_fields(response_format)}


def default_rate(response_format: str, asked_rate: int | None) -> int:
    """The rate an answer is in when it does not say: the one asked, else G.711's 8 kHz or the model's 24 kHz."""
    if asked_rate is not None:
        return asked_rate
    return G711_RATE if response_format in G711_FORMATS else SAMPLE_RATE


class _BodyRecorder:
    """One response's timeline: every body piece's whole samples, then how it ended."""

    def __init__(self, index: int, prompt_id: str, started_at: float, response_format: str = "pcm",
                 asked_rate: int | None = None) -> None:
        self.index, self.prompt_id, self.started_at = index, prompt_id, started_at
        self.response_format, self.asked_rate = response_format, asked_rate
        self.sent_at: float | None = None
        self.request_id: str | None = None
        self.served_rate = default_rate(response_format, asked_rate)
        self.scanner: PcmScanner | DecodedScanner = (
            PcmScanner() if response_format == "pcm" else DecodedScanner(response_format))
        self.chunks: list[ChunkArrival] = []
        self.error: StreamError | None = None
        self.ended_at: float | None = None

    def feed(self, data: bytes, at: float) -> None:
        self.chunks.append(ChunkArrival(at=at, num_samples=self.scanner.feed(data, at)))

    def finish(self, at: float) -> None:
        """The body ended whole: the samples a decoder held back, then the checks only the end allows."""
        held_back = self.scanner.finish(at)
        if held_back:
            self.chunks.append(ChunkArrival(at=at, num_samples=held_back))
        declared = self.scanner.declared_rate
        if self.scanner.has_partial_sample:
            self.end(at, StreamError("incomplete_audio", "the body ended in the middle of a sample or frame"))
        elif declared is not None and declared != self.served_rate:
            self.end(at, StreamError("protocol_error", f"the {self.response_format} stream says {declared} Hz, "
                                                       f"X-Sample-Rate {self.served_rate} Hz"))
        self.end(at)

    @property
    def counted_rate(self) -> int:
        """The rate of the samples counted: the decoder's own (Opus: 48 kHz), else the answer's."""
        return self.scanner.decode_rate or self.served_rate

    def end(self, at: float, error: StreamError | None = None) -> None:
        if self.ended_at is None:
            self.ended_at, self.error = at, error

    def record(self) -> StreamRecord:
        return StreamRecord(index=self.index, prompt_id=self.prompt_id, started_at=self.started_at,
                            sent_at=self.sent_at, ended_at=self.ended_at, chunks=tuple(self.chunks),
                            sample_rate=self.counted_rate, request_id=self.request_id, error=self.error,
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
                      timeout_s: float = 120.0, response_format: str = "pcm") -> StreamRecord:
        """POST `payload` (the speech fields, `sample_rate` among them when one is asked; the streamed fields of
        `response_format` are added) and time the body to its end. Never raises for the server's or the network's
        failures: they end up in the record's `error` (client-side codes: connect_failed, client_timeout,
        connection_closed, incomplete_audio, protocol_error, rate_mismatch, undecodable_audio)."""
        recorder = _BodyRecorder(index, prompt_id, perf_counter(), response_format, payload.get("sample_rate"))
        try:
            async with asyncio.timeout(timeout_s):
                await self._exchange(url, speech_body(payload, response_format), recorder)
        except TimeoutError:
            recorder.end(perf_counter(), StreamError("client_timeout", f"no end of body within {timeout_s:.1f} s"))
        except httpx.ConnectError as exc:
            recorder.end(perf_counter(), StreamError("connect_failed", f"cannot open {url}: {exc}"))
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            recorder.end(perf_counter(), StreamError("connection_closed", f"the body ended early: {exc}"))
        except httpx.HTTPError as exc:
            recorder.end(perf_counter(), StreamError("connect_failed", f"{type(exc).__name__}: {exc}"))
        except AudioDecodeError as exc:
            recorder.end(perf_counter(), StreamError(exc.code, str(exc)))
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
            if (refusal := _header_refusal(response.headers, recorder)) is not None:
                recorder.end(perf_counter(), refusal)
                return
            async for piece in response.aiter_raw():
                recorder.feed(piece, perf_counter())
        recorder.finish(perf_counter())


def _header_refusal(headers: httpx.Headers, recorder: _BodyRecorder) -> StreamError | None:
    """Why a 200's headers already fail the request (another media type, another rate than asked), or None; keeps
    the answer's rate in `recorder.served_rate`."""
    media = headers.get("content-type", "")
    expected = MEDIA_TYPES.get(recorder.response_format, ())
    if not media.startswith(expected):
        return StreamError("protocol_error", f"expected {' or '.join(expected)}, got {media!r}")
    try:
        recorder.served_rate = int(headers.get("x-sample-rate", recorder.served_rate))
    except ValueError:
        return StreamError("protocol_error", f"X-Sample-Rate {headers['x-sample-rate']!r} is not a number")
    if recorder.asked_rate is not None and recorder.served_rate != recorder.asked_rate:
        return StreamError("rate_mismatch", f"asked for {recorder.asked_rate} Hz, the answer is "
                                            f"{recorder.served_rate} Hz")
    return None


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
