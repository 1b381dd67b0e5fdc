"""Hot-path payloads: codec frames on `tts.codes.<partition>.<id>` and PCM on `tts.audio.<id>`."""

from __future__ import annotations

from typing import Literal

import numpy as np

from messages.base import ErrorInfo, HotMessage, InvalidMessage, NonNegInt, PosInt, ReplicaName, RequestId, Usage

NUM_CODEBOOKS = 16
CodesDtype = Literal["int16", "int32"]


class CodesChunk(HotMessage, tag="codes", kw_only=True, frozen=True):
    """Consecutive codec frames of one request.

    Attributes:
        request_id: the request.
        seq: chunk number, 0, 1, 2... per request; audio chunk boundaries follow these chunks.
        first_frame: index of the chunk's first frame in the request.
        epoch: the owner's epoch (from `owner.<id>`) that produced it.
        dtype: element type of `codes`, little-endian.
        codes: row-major [n, 16] codes, raw bytes.
        context: row-major [m, 16] codes in `dtype` that the vocoder decodes before `codes` and does not voice
            (empty: none). Only chunk 0 carries it: an in-context clone's reference frames, whose audio the model
            continues, so the codec's state holds them as the reference package's decode of reference + generated
            frames does (a few kB: at most 375 frames of a 30 s reference).
    """

    request_id: RequestId
    seq: NonNegInt
    first_frame: NonNegInt
    epoch: NonNegInt
    dtype: CodesDtype
    codes: bytes
    context: bytes = b""  # appended last: older readers skip it

    def __post_init__(self) -> None:
        row_bytes = NUM_CODEBOOKS * np.dtype(self.dtype).itemsize
        if not self.codes or len(self.codes) % row_bytes:
            raise InvalidMessage(f"codes has {len(self.codes)} bytes: not a positive multiple of [.,16] {self.dtype}")
        if len(self.context) % row_bytes:
            raise InvalidMessage(f"context has {len(self.context)} bytes: not a multiple of [.,16] {self.dtype}")
        if self.context and self.seq != 0:
            raise InvalidMessage(f"chunk {self.seq} carries context frames: only chunk 0 may")

    @classmethod
    def from_frames(cls, *, request_id: str, seq: int, first_frame: int, epoch: int, frames: np.ndarray,
                    context: np.ndarray | None = None) -> CodesChunk:
        """Build from an integer array [n, 16] (int16 when every code fits, else int32), and on chunk 0 the
        context frames [m, 16] decoded before it and not voiced."""
        array = _frames_array(frames, "frames")
        rows = [array] if context is None else [array, _frames_array(context, "context")]
        fits = all(r.min() >= -(2**15) and r.max() < 2**15 for r in rows)
        dtype: CodesDtype = "int16" if fits else "int32"
        data = [np.ascontiguousarray(r, dtype=np.dtype(dtype).newbyteorder("<")).tobytes() for r in rows]
        return cls(request_id=request_id, seq=seq, first_frame=first_frame, epoch=epoch, dtype=dtype, codes=data[0],
                   context=data[1] if context is not None else b"")

    @property
    def num_frames(self) -> int:
        """Frames in this chunk."""
        return len(self.codes) // (NUM_CODEBOOKS * np.dtype(self.dtype).itemsize)

    def frames(self) -> np.ndarray:
        """The codes as an int64 array [n, 16] (a copy, ready for torch.from_numpy)."""
        return self._rows(self.codes)

    def context_frames(self) -> np.ndarray | None:
        """The context frames as an int64 array [m, 16], or None when the chunk has none."""
        return self._rows(self.context) if self.context else None

    def _rows(self, data: bytes) -> np.ndarray:
        flat = np.frombuffer(data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        return flat.reshape(-1, NUM_CODEBOOKS).astype(np.int64)


def _frames_array(frames: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(frames)
    if array.ndim != 2 or array.shape[1] != NUM_CODEBOOKS or array.shape[0] == 0:
        raise InvalidMessage(f"{what} must have shape [n>0, 16], got {list(array.shape)}")
    return array


class CodesEnd(HotMessage, tag="codes_end", kw_only=True, frozen=True):
    """Decode's in-band end of a request's codes; the vocoder publishes the terminal event after it.

    Attributes:
        request_id: the request.
        seq: one past the last CodesChunk's seq (= number of codes chunks).
        epoch: the owner's epoch.
        reason: "finished" or "failed".
        total_frames: frames emitted in all.
        stop: why generation stopped when finished: "eos" or "length" (max_new_tokens or the runaway guard).
        error: the failure when reason is "failed".
        usage: what the request consumed.
    """

    request_id: RequestId
    seq: NonNegInt
    epoch: NonNegInt
    reason: Literal["finished", "failed"]
    total_frames: NonNegInt
    stop: Literal["eos", "length"] | None = None
    error: ErrorInfo | None = None
    usage: Usage = Usage()

    def __post_init__(self) -> None:
        if (self.reason == "failed") != (self.error is not None):
            raise InvalidMessage(f"CodesEnd reason {self.reason!r} needs error exactly when failed")


class TakeoverMarker(HotMessage, tag="takeover", kw_only=True, frozen=True):
    """Published by a new owner on the codes subject, fenced on the last sequence it read, before any codes.

    From then on only the new owner's expected-sequence chain can append; a stale owner is refused by the server.

    Attributes:
        request_id: the request.
        epoch: the new owner's epoch.
        replica: the new owner.
        resume_frame: frames already in CODES that the new owner continues from.
        next_seq: the seq of the next CodesChunk it will publish.
    """

    request_id: RequestId
    epoch: NonNegInt
    replica: ReplicaName
    resume_frame: NonNegInt
    next_seq: NonNegInt


CodesMessage = CodesChunk | CodesEnd | TakeoverMarker
"""Everything that appears on a codes subject."""


class AudioChunk(HotMessage, tag="audio", kw_only=True, frozen=True):
    """PCM of one request, core NATS. Numbering is a deterministic function of the codes chunks.

    Attributes:
        request_id: the request.
        seq: chunk number, 0, 1, 2...; a re-decode yields the same numbered chunks.
        first_sample: index of the chunk's first sample in the request's audio.
        sample_rate: samples per second (24000).
        pcm: signed 16-bit little-endian mono samples.
    """

    request_id: RequestId
    seq: NonNegInt
    first_sample: NonNegInt
    sample_rate: PosInt
    pcm: bytes

    def __post_init__(self) -> None:
        if len(self.pcm) % 2:
            raise InvalidMessage(f"pcm has {len(self.pcm)} bytes: s16le needs an even count")

    @classmethod
    def from_float(cls, *, request_id: str, seq: int, first_sample: int, sample_rate: int,
                   samples: np.ndarray) -> AudioChunk:
        """Build from float samples in [-1, 1] (clipped, scaled to int16)."""
        clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
        pcm = np.round(clipped * 32767.0).astype("<i2").tobytes()
        return cls(request_id=request_id, seq=seq, first_sample=first_sample, sample_rate=sample_rate, pcm=pcm)

    @property
    def num_samples(self) -> int:
        """Samples in this chunk."""
        return len(self.pcm) // 2

    def samples(self) -> np.ndarray:
        """The samples as an int16 array."""
        return np.frombuffer(self.pcm, dtype="<i2").copy()
