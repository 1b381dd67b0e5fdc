"""The client side of the gateway's WebSocket `/v1/audio/speech/stream`: which gateway a load test may hit, the
stream protocol, and one timed request with the asyncio `websockets` client.

The client sends one JSON text message with the speech fields; the gateway answers `{"type": "audio.start",
"request_id", "format": "pcm_s16le", "sample_rate", "channels": 1}`, binary frames of s16le mono PCM in order,
then `{"type": "audio.done", "samples", ...}` or `{"type": "error", "code", "message", "stage", ...}` (after the
audio made so far, when a request fails mid-stream). `StreamRecorder` turns those messages, with their arrival
times, into a `StreamRecord`, independent of any socket library: the asyncio client here and the Locust user's
blocking one (locustfile.py) feed it the same way. Times come from `time.perf_counter`.

A request may ask for G.711 frames (`format`: `pcm_mulaw`, `pcm_alaw`, one byte a sample, decoded by table) and
for another rate (`sample_rate`); `audio.start` says the rate the frames are in. Audio resampled from the model's
24 kHz may count its `audio.done` samples at 24 kHz (G.711 does) and ends with a resampling filter's tail, so at any
rate but 24 kHz the samples received need only match the announced ones within RESAMPLED_SLACK_S.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
from time import perf_counter
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from loadtest.bench.audible import PcmScanner
from loadtest.bench.audio_decode import G711_TABLES
from loadtest.bench.metrics import ChunkArrival, StreamError, StreamRecord
from messages.audio_format import BYTES_PER_SAMPLE, SAMPLE_RATE

STREAM_PATH = "/v1/audio/speech/stream"
PCM_FORMAT = "pcm_s16le"
G711_STREAM_FORMATS = {"pcm_mulaw": "ulaw", "pcm_alaw": "alaw"}
"""The socket's binary G.711 formats and the law of each."""
STREAM_FORMAT_OF = {"pcm": PCM_FORMAT, **{law: name for name, law in G711_STREAM_FORMATS.items()}}
"""The socket's `format` for each `response_format` it can send (the bench's --response-format)."""
DEFAULT_SAMPLE_RATE = SAMPLE_RATE
RESAMPLED_SLACK_S = 0.02
_WS_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
# Audio frames are a chunk's PCM (a few hundred KB at most); the default 1 MiB cap is lifted so a large
# initial chunk is measured instead of failing the connection.
_MAX_MESSAGE_BYTES = None


class TargetError(ValueError):
    """A gateway URL the bench refuses (malformed, or not loopback without the override).

    Attributes:
        code: `invalid_url` or `not_loopback`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; a name is never resolved (a resolver could point it anywhere)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def stream_url(gateway_url: str, *, allow_remote: bool = False) -> str:
    """The WebSocket stream endpoint of a gateway given as `http://host:port` (or `ws://...`, with or without the
    path). Raises TargetError for a non-loopback host unless `allow_remote`."""
    parts = urlsplit(gateway_url)
    scheme = _WS_SCHEMES.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise TargetError("invalid_url", f"{gateway_url!r} is not a gateway URL: use http://127.0.0.1:PORT")
    if not allow_remote and not is_loopback_host(parts.hostname):
        raise TargetError("not_loopback", f"refusing to load-test {parts.hostname}: only loopback gateways "
                                          "(127.0.0.0/8, ::1, localhost) unless you pass --allow-remote")
    path = parts.path.rstrip("/")
    if not path.endswith(STREAM_PATH):
        path += STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def check_events_url(nats_url: str, *, allow_remote: bool = False) -> None:
    """A mesh's NATS URL for the stage breakdown: nats:// or tls://, on loopback unless `allow_remote` (the stages
    compare its services' clocks with the bench's, which only one host's clock makes comparable)."""
    parts = urlsplit(nats_url)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise TargetError("invalid_url", f"{nats_url!r} is not a NATS URL: use nats://127.0.0.1:4222")
    if not allow_remote and not is_loopback_host(parts.hostname):
        raise TargetError("not_loopback", f"refusing to read events from {parts.hostname}: the stage breakdown "
                                          "needs the mesh on this host (or pass --allow-remote)")


def redacted(text: str) -> str:
    """`text` with the password of any URL's user info in it (nats://user:secret@host) replaced by ***, for
    documents and logs (a bare URL, or a flag such as --events-url=URL)."""
    return _USERINFO_PASSWORD.sub(r"\1***@", text)


_USERINFO_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@/\s]+@")


class StreamRecorder:
    """Accumulates one request's timeline; `on_message` says when the stream has ended."""

    def __init__(self, index: int, prompt_id: str, started_at: float) -> None:
        self.index = index
        self.prompt_id = prompt_id
        self.started_at = started_at
        self.sent_at: float | None = None
        self.request_id: str | None = None
        self.sample_rate = DEFAULT_SAMPLE_RATE
        self.num_bytes = 0
        self._law: str | None = None  # a G.711 stream's law
        self._chunks: list[ChunkArrival] = []
        self._scanner = PcmScanner()
        self._started = False
        self._ended_at: float | None = None
        self._error: StreamError | None = None

    @property
    def is_done(self) -> bool:
        return self._ended_at is not None

    @property
    def num_samples(self) -> int:
        return self.num_bytes if self._law is not None else self.num_bytes // BYTES_PER_SAMPLE

    def mark_sent(self, at: float) -> None:
        self.sent_at = at

    def on_message(self, message: str | bytes, at: float) -> bool:
        """Take one WebSocket message that arrived at `at`; True once the stream has ended."""
        if self.is_done:
            return True
        if isinstance(message, bytes | bytearray | memoryview):
            self._on_audio(bytes(message), at)
        else:
            self._on_event(message, at)
        return self.is_done

    def fail(self, code: str, message: str, at: float, stage: str | None = None) -> None:
        """End the stream on the client's side (timeout, lost connection); a stream already ended keeps its end."""
        if not self.is_done:
            self._end(at, StreamError(code=code, message=message, stage=stage))

    def record(self) -> StreamRecord:
        """The finished timeline; a stream that never ended is recorded as cut off."""
        if self._ended_at is None:
            raise RuntimeError("record() before the stream ended: call fail() for a stream the client gave up on")
        return StreamRecord(index=self.index, prompt_id=self.prompt_id, started_at=self.started_at,
                            sent_at=self.sent_at, ended_at=self._ended_at, chunks=tuple(self._chunks),
                            sample_rate=self.sample_rate, request_id=self.request_id, error=self._error,
                            first_byte_at=self._scanner.first_byte_at, first_audible=self._scanner.first_audible)

    def _on_audio(self, pcm: bytes, at: float) -> None:
        if not self._started:
            self._end(at, StreamError("protocol_error", "binary audio arrived before audio.start"))
        elif self._law is not None:
            self.num_bytes += len(pcm)
            samples = G711_TABLES[self._law][np.frombuffer(pcm, dtype=np.uint8)]
            if samples.size and self._scanner.first_byte_at is None:
                self._scanner.first_byte_at = at
            self._chunks.append(ChunkArrival(at=at, num_samples=self._scanner.feed_samples(samples, at)))
        elif len(pcm) % BYTES_PER_SAMPLE:
            self._end(at, StreamError("protocol_error", f"a PCM frame of {len(pcm)} bytes is not whole s16 samples"))
        else:
            self.num_bytes += len(pcm)
            self._chunks.append(ChunkArrival(at=at, num_samples=self._scanner.feed(pcm, at)))

    def _on_event(self, text: str, at: float) -> None:
        try:
            event = json.loads(text)
            kind = event["type"]
        except (ValueError, TypeError, KeyError):
            self._end(at, StreamError("protocol_error", f"not a JSON event with a type: {text[:200]!r}"))
            return
        self.request_id = event.get("request_id") or self.request_id
        if kind == "audio.start":
            self._on_start(event, at)
        elif kind == "audio.done":
            self._on_done(event, at)
        elif kind == "error":
            self._end(at, StreamError(code=str(event.get("code", "unknown")), message=str(event.get("message", "")),
                                      stage=event.get("stage")))

    def _on_start(self, event: dict, at: float) -> None:
        audio_format = event.get("format", PCM_FORMAT)
        if audio_format not in (PCM_FORMAT, *G711_STREAM_FORMATS) or event.get("channels", 1) != 1:
            self._end(at, StreamError("protocol_error", f"expected mono {PCM_FORMAT}, pcm_mulaw or pcm_alaw, the "
                                                        f"gateway sends {event}"))
            return
        self._law = G711_STREAM_FORMATS.get(audio_format)
        self.sample_rate = int(event.get("sample_rate", DEFAULT_SAMPLE_RATE))
        self._started = True

    def _samples_match(self, announced: int) -> bool:
        """The samples received are the ones `audio.done` announced (at a resampled rate: within the slack)."""
        if announced == self.num_samples or self.sample_rate == DEFAULT_SAMPLE_RATE:
            return announced == self.num_samples
        expected = announced * self.sample_rate / DEFAULT_SAMPLE_RATE  # announced at the model's rate
        return abs(self.num_samples - expected) <= RESAMPLED_SLACK_S * self.sample_rate

    def _on_done(self, event: dict, at: float) -> None:
        announced = event.get("samples")
        if announced is not None and not self._samples_match(announced):
            self._end(at, StreamError("incomplete_audio", f"audio.done announced {announced} samples, "
                                                          f"{self.num_samples} arrived"))
            return
        self._end(at, None)

    def _end(self, at: float, error: StreamError | None) -> None:
        self._ended_at = at
        self._error = error


async def stream_request(url: str, payload: dict, *, index: int = 0, prompt_id: str = "", timeout_s: float = 120.0,
                         api_key: str | None = None) -> StreamRecord:
    """Open a socket to `url` (the `.../v1/audio/speech/stream` endpoint), send `payload`, and record every
    message until `audio.done` or `error`. Never raises for the server's or the network's failures: they end up
    in the record's `error` (client-side codes: connect_failed, client_timeout, connection_closed)."""
    recorder = StreamRecorder(index, prompt_id, perf_counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(url, payload, recorder, headers)
    except TimeoutError:
        recorder.fail("client_timeout", f"no end of stream within {timeout_s:.1f} s", perf_counter())
    except ConnectionClosed as exc:
        recorder.fail("connection_closed", f"the gateway closed the socket mid-stream: {exc}", perf_counter())
    except (InvalidHandshake, InvalidURI, OSError) as exc:
        recorder.fail("connect_failed", f"cannot open {url}: {exc}", perf_counter())
    return recorder.record()


async def _exchange(url: str, payload: dict, recorder: StreamRecorder, headers: dict | None) -> None:
    # proxy=None: a load test never goes through a proxy from the environment (loopback traffic only).
    async with connect(url, additional_headers=headers, compression=None, max_size=_MAX_MESSAGE_BYTES, proxy=None,
                       open_timeout=None, ping_interval=None) as socket:
        message = json.dumps(payload)
        # Stamped as the message is handed over, not after `send` returns: that await may resume after the mesh has
        # already started the request (the submit stage came out -1.4 ms on a busy CPU).
        recorder.mark_sent(perf_counter())
        await socket.send(message)
        async for message in socket:
            if recorder.on_message(message, perf_counter()):
                return
    recorder.fail("connection_closed", "the gateway closed the socket before audio.done", perf_counter())
