"""What one stream puts on the bus, from the services' code: decode's codes chunks (the chunk ramp of
`services.decode.codes_stream.ChunkRule` with decode's default settings) at 12.5 frames per second, and the
vocoder's audio chunks (one per codes chunk, 1920 16-bit samples per frame at 24 kHz)."""

from __future__ import annotations

from dataclasses import dataclass

FRAME_RATE_HZ = 12.5
SAMPLE_RATE_HZ = 24000
SAMPLES_PER_FRAME = int(SAMPLE_RATE_HZ / FRAME_RATE_HZ)  # 1920
BYTES_PER_SAMPLE = 2  # s16le mono


@dataclass(frozen=True, slots=True)
class StreamShape:
    """One request's codes and audio: `frames` frames in chunks of initial, initial, 2x... up to `chunk_frames`."""

    frames: int = 100  # 8 s of audio
    initial_chunk_frames: int = 2
    chunk_frames: int = 8

    def chunk_size(self, seq: int) -> int:
        """Frames in chunk `seq` (the last chunk of a request may be shorter: see `chunk_sizes`)."""
        if seq <= 1:
            return self.initial_chunk_frames
        return max(self.initial_chunk_frames, min(self.chunk_frames, self.initial_chunk_frames << (seq - 1)))

    def chunk_sizes(self) -> list[int]:
        """Every chunk's frames for a request of `frames` frames."""
        sizes, left, seq = [], self.frames, 0
        while left > 0:
            size = min(self.chunk_size(seq), left)
            sizes.append(size)
            left -= size
            seq += 1
        return sizes

    @property
    def seconds(self) -> float:
        """Audio seconds one request makes (what generating it takes at real time)."""
        return self.frames / FRAME_RATE_HZ

    def audio_bytes(self, frames: int) -> int:
        """PCM bytes of `frames` frames."""
        return frames * SAMPLES_PER_FRAME * BYTES_PER_SAMPLE
