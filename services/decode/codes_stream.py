"""One request's codes as decode publishes them: frames gathered into numbered CodesChunks, then one CodesEnd.

The chunking rule is deterministic (the vocoder's audio chunks follow it, so a re-decode yields the same numbered
chunks): chunk 0 holds `initial_chunk_frames` frames, chunk 1 as many again, and each later chunk doubles up to
`chunk_frames` (2, 2, 4, 8, 8, ... by default); only the last chunk, sent when the request ends, may be shorter.

Why a ramp: the player starts at the first chunk, so the next chunk must be made before the audio already sent runs
out. After a first chunk of 2 frames (160 ms), a second chunk of 8 frames would need a step under 20 ms to arrive
in time; a second chunk of 2 needs only real time (80 ms a step), and doubling from there keeps the buffer ahead
whenever the stream runs at about twice real time or better.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from messages.base import ErrorInfo, Usage
from messages.frames import NUM_CODEBOOKS, CodesChunk, CodesEnd
from services.bus.codes_publisher import CodesPublisher
from services.decode.publish_retry import PublishRetry, append_retrying


@dataclass(frozen=True, slots=True)
class ChunkRule:
    """Frames per chunk: `initial` for chunks 0 and 1 (a low first packet), then doubling up to `later`."""

    initial: int
    later: int

    def size(self, seq: int) -> int:
        if seq <= 1:
            return self.initial
        return max(self.initial, min(self.later, self.initial << (seq - 1)))

    def frames_before(self, seq: int) -> int:
        """Frames in chunks 0..seq-1, all full."""
        return sum(self.size(k) for k in range(seq))


@dataclass(slots=True)
class CodesStream:
    """The publishing side of one request: pending frames, the next chunk number, and the fenced publisher."""

    request_id: str
    epoch: int
    publisher: CodesPublisher
    rule: ChunkRule
    next_seq: int = 0
    """The seq of the next CodesChunk (also the CodesEnd's seq once the request ends)."""
    num_published_frames: int = 0
    num_landed_chunks: int = 0
    """CodesChunks the server has acknowledged (the vocoder's audio chunks follow them one for one)."""
    num_landed_frames: int = 0
    """Frames those chunks carry."""
    retry: PublishRetry = PublishRetry()
    context: np.ndarray | None = None
    """Frames [m, 16] chunk 0 carries for the vocoder to decode before it, unvoiced (an in-context clone's reference
    frames); set before the first chunk is taken."""
    _pending: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A stream taken over mid-request starts after chunks an earlier owner landed.
        self.num_landed_chunks, self.num_landed_frames = self.next_seq, self.num_published_frames

    @property
    def num_pending_frames(self) -> int:
        return len(self._pending)

    @property
    def num_frames(self) -> int:
        """Frames emitted so far, published or pending."""
        return self.num_published_frames + len(self._pending)

    def add_frame(self, index: int, codes: np.ndarray) -> None:
        """Queue frame `index` (int [16]); frames must arrive in order, exactly once."""
        if index != self.num_frames:
            raise ValueError(f"request {self.request_id}: frame {index} arrived, expected frame {self.num_frames}")
        if codes.shape != (NUM_CODEBOOKS,):
            raise ValueError(f"request {self.request_id}: a frame has 16 codes, got shape {codes.shape}")
        self._pending.append(codes)

    def take_ready_chunks(self) -> list[CodesChunk]:
        """Every full chunk the pending frames make (possibly none); they count as published from now on."""
        chunks = []
        while self._pending and len(self._pending) >= self.rule.size(self.next_seq):
            chunks.append(self._take(self.rule.size(self.next_seq)))
        return chunks

    def take_rest(self) -> list[CodesChunk]:
        """At the end of a request: full chunks, then the shorter last one."""
        chunks = self.take_ready_chunks()
        if self._pending:
            chunks.append(self._take(len(self._pending)))
        return chunks

    def _take(self, count: int) -> CodesChunk:
        frames, self._pending = self._pending[:count], self._pending[count:]
        chunk = CodesChunk.from_frames(request_id=self.request_id, seq=self.next_seq,
                                       first_frame=self.num_published_frames, epoch=self.epoch,
                                       frames=np.stack(frames), context=self.context if self.next_seq == 0 else None)
        self.next_seq += 1
        self.num_published_frames += count
        return chunk

    def finished(self, stop: str, usage: Usage) -> CodesEnd:
        """The CodesEnd of a request that ended normally (stop "eos" or "length"); call after `take_rest`."""
        return CodesEnd(request_id=self.request_id, seq=self.next_seq, epoch=self.epoch, reason="finished",
                        total_frames=self.num_published_frames, stop=stop, usage=usage)

    def failed(self, error: ErrorInfo, usage: Usage) -> CodesEnd:
        """The CodesEnd of a failed request; frames already published stay valid (the client gets their audio)."""
        return CodesEnd(request_id=self.request_id, seq=self.next_seq, epoch=self.epoch, reason="failed",
                        total_frames=self.num_published_frames, error=error, usage=usage)

    async def publish(self, messages: list[CodesChunk | CodesEnd]) -> None:
        """Append `messages` in order, each retried through a bus blip (`retry`). Raises StaleOwner when another
        owner has taken the request over, the bus error when an append failed every attempt."""
        for message in messages:
            await append_retrying(self.publisher, message, self.retry)
            if isinstance(message, CodesChunk):
                self.num_landed_chunks = message.seq + 1
                self.num_landed_frames = message.first_frame + message.num_frames
