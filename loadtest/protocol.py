"""The client side of the gateway's WebSocket `/v1/audio/speech/stream`, independent of any socket library.

The client sends one JSON text message with the speech fields; the gateway answers `{"type": "audio.start",
"request_id", "format": "pcm_s16le", "sample_rate", "channels": 1}`, binary frames of s16le mono PCM in order,
then `{"type": "audio.done", "samples", ...}` or `{"type": "error", "code", "message", "stage", ...}` (after the
audio made so far, when a request fails mid-stream). `StreamRecorder` turns those messages, with their arrival
times, into a `StreamRecord`; the asyncio client (client.py) and the Locust user feed it the same way.
"""

from __future__ import annotations

import json

from loadtest.metrics import ChunkArrival, StreamError, StreamRecord
from messages.audio_format import BYTES_PER_SAMPLE, SAMPLE_RATE

STREAM_PATH = "/v1/audio/speech/stream"
PCM_FORMAT = "pcm_s16le"
DEFAULT_SAMPLE_RATE = SAMPLE_RATE


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
        self._chunks: list[ChunkArrival] = []
        self._started = False
        self._ended_at: float | None = None
        self._error: StreamError | None = None

    @property
    def is_done(self) -> bool:
        return self._ended_at is not None

    @property
    def num_samples(self) -> int:
        return self.num_bytes // BYTES_PER_SAMPLE

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
                            sample_rate=self.sample_rate, request_id=self.request_id, error=self._error)

    def _on_audio(self, pcm: bytes, at: float) -> None:
        if not self._started:
            self._end(at, StreamError("protocol_error", "binary audio arrived before audio.start"))
        elif len(pcm) % BYTES_PER_SAMPLE:
            self._end(at, StreamError("protocol_error", f"a PCM frame of {len(pcm)} bytes is not whole s16 samples"))
        else:
            self.num_bytes += len(pcm)
            self._chunks.append(ChunkArrival(at=at, num_samples=len(pcm) // BYTES_PER_SAMPLE))

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
        if event.get("format", PCM_FORMAT) != PCM_FORMAT or event.get("channels", 1) != 1:
            self._end(at, StreamError("protocol_error", f"expected mono {PCM_FORMAT}, the gateway sends {event}"))
            return
        self.sample_rate = int(event.get("sample_rate", DEFAULT_SAMPLE_RATE))
        self._started = True

    def _on_done(self, event: dict, at: float) -> None:
        announced = event.get("samples")
        if announced is not None and announced != self.num_samples:
            self._end(at, StreamError("incomplete_audio", f"audio.done announced {announced} samples, "
                                                          f"{self.num_samples} arrived"))
            return
        self._end(at, None)

    def _end(self, at: float, error: StreamError | None) -> None:
        self._ended_at = at
        self._error = error
