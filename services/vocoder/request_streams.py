"""Per-request streaming state: the codec state and where the request's audio stands.

A stream opens on a request's first codes message, advances one CodesChunk at a time (audio seq = codes seq), and is
released on CodesEnd, on owner death, or when this replica loses the request's partition. Released ids are
remembered for a while so that a late or redelivered message never reopens a request that already ended.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from messages.frames import CodesChunk


@dataclass(slots=True)
class RequestStream:
    """One in-flight request on this vocoder.

    Attributes:
        request_id: the request.
        partition: its vocoder partition.
        codec_state: the request's codec slot (`CodecWorker.new_stream()`, released with the stream); None until
            the first message is handled (it is taken on the codec thread).
        epoch: the newest decode-owner epoch seen (TakeoverMarker or chunk); chunks of lower epochs are stale.
        owner: the decode replica producing its codes, once known (TakeoverMarker or `owner.<id>`).
        next_seq: the seq of the next CodesChunk to voice (= audio chunks published so far).
        frames: frames voiced so far.
        first_audio_sent: whether FirstAudio went out.
        audio_started_at: the event loop's time the first audio went out (None before): the listener's playback
            is taken to start then, so the audio it has in hand is what was voiced since less what has played.
        owner_dead_since: monotonic time the owner watch first saw `owner_dead_owner` dead (None: owner alive).
        owner_dead_owner: the dead owner that clock is for (a takeover by a replica that dies too starts it again).
        lock: held while a message of the request is handled, so that the owner watch never ends it mid-chunk.
    """

    request_id: str
    partition: int
    codec_state: Any
    epoch: int = 0
    owner: str | None = None
    next_seq: int = 0
    frames: int = 0
    first_audio_sent: bool = False
    audio_started_at: float | None = None
    owner_dead_since: float | None = None
    owner_dead_owner: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def note_epoch(self, epoch: int, owner: str | None = None) -> None:
        """Record an owner epoch (from a TakeoverMarker when `owner` is given); older epochs change nothing."""
        if epoch > self.epoch or (epoch == self.epoch and owner is not None):
            self.epoch = epoch
            if owner is not None:
                self.owner = owner

    def is_stale(self, epoch: int) -> bool:
        """True for a message from an owner older than the newest one seen."""
        return epoch < self.epoch

    def advance(self, chunk: CodesChunk) -> None:
        """The chunk was voiced: move past it."""
        self.next_seq = chunk.seq + 1
        self.frames = chunk.first_frame + chunk.num_frames
        self.note_epoch(chunk.epoch)


class StreamTable:
    """The in-flight requests of this replica, bounded by `max_streams`."""

    def __init__(self, max_streams: int, *, remember_ended: int = 10_000) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.max_streams = max_streams
        self._streams: dict[str, RequestStream] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._remember_ended = remember_ended

    def __len__(self) -> int:
        return len(self._streams)

    def get(self, request_id: str) -> RequestStream | None:
        return self._streams.get(request_id)

    def is_full(self) -> bool:
        return len(self._streams) >= self.max_streams

    def has_ended(self, request_id: str) -> bool:
        """True when this replica already ended the request (its terminal went out, or it was given up)."""
        return request_id in self._ended

    def add(self, stream: RequestStream) -> RequestStream:
        if stream.request_id in self._streams:
            raise KeyError(f"request {stream.request_id} already has a stream")
        self._streams[stream.request_id] = stream
        return stream

    def release(self, request_id: str, *, ended: bool) -> RequestStream | None:
        """Drop a request's state; `ended` remembers that it must not be reopened."""
        stream = self._streams.pop(request_id, None)
        if stream is not None and stream.codec_state is not None:
            stream.codec_state.release()  # its codec slot goes back to the pool
        if ended:
            self._ended[request_id] = None
            self._ended.move_to_end(request_id)
            while len(self._ended) > self._remember_ended:
                self._ended.popitem(last=False)
        return stream

    def streams(self) -> list[RequestStream]:
        """A snapshot of the in-flight streams."""
        return list(self._streams.values())

    def in_partition(self, partition: int) -> list[RequestStream]:
        return [s for s in self._streams.values() if s.partition == partition]
