"""Publishing PCM on core NATS (`tts.audio.<id>`) and the FirstAudio lifecycle event."""

from __future__ import annotations

import logging

import numpy as np
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from messages import encode, subjects
from messages.events import FirstAudio, event_subject
from messages.frames import AudioChunk, CodesChunk

log = logging.getLogger(__name__)

MSG_ID = api.Header.MSG_ID.value


class AudioPublisher:
    """Turns decoded samples into numbered AudioChunks: seq = the codes chunk's seq, first_sample = first_frame *
    samples_per_frame, so a re-decode produces the same numbered chunks."""

    def __init__(self, nc: Client, js: JetStreamContext, *, replica: str, sample_rate: int,
                 samples_per_frame: int) -> None:
        self._nc, self._js = nc, js
        self.replica = replica
        self.sample_rate = sample_rate
        self.samples_per_frame = samples_per_frame
        self.num_published = 0

    def chunk(self, codes: CodesChunk, samples: np.ndarray) -> AudioChunk:
        """The AudioChunk of one decoded codes chunk."""
        return AudioChunk.from_float(request_id=codes.request_id, seq=codes.seq,
                                     first_sample=codes.first_frame * self.samples_per_frame,
                                     sample_rate=self.sample_rate, samples=samples)

    async def publish(self, codes: CodesChunk, samples: np.ndarray) -> AudioChunk:
        """Publish the audio of `codes` (core NATS: fire and forget; a loss costs a re-decode)."""
        audio = self.chunk(codes, samples)
        await self._nc.publish(subjects.audio(codes.request_id), encode(audio))
        self.num_published += 1
        return audio

    async def first_audio(self, request_id: str, at: float) -> None:
        """Record on EVENTS that the request's first PCM went out at `at` (unix time: when it was handed to the
        bus)."""
        event = FirstAudio(request_id=request_id, at=at, replica=self.replica)
        try:
            # One FirstAudio per request even when a takeover voices chunk 0 again (dedup window).
            await self._js.publish(event_subject(event), encode(event), headers={MSG_ID: f"{request_id}:first_audio"})
        except Exception:  # an event is for people; losing one must not fail the audio
            log.warning("could not publish first_audio for %s", request_id, exc_info=True)
