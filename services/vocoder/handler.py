"""What the vocoder does with each codes message of a partition it owns.

- TakeoverMarker: learn the request's decode owner and epoch.
- CodesChunk: voice it (one AudioChunk, same seq), then ack. A chunk from an epoch older than the newest marker is
  stale and ignored; a seq already voiced is a redelivery and only acked; a seq past the next one means this
  replica missed earlier chunks (partition takeover, or a message still awaiting redelivery), so the codec state is
  first rebuilt from CODES.
- CodesEnd: voice anything still missing, publish the terminal event through the guard, drop the state, ack.
Messages of one request arrive here one at a time (see partition_consumer.py); different requests run concurrently and their
codec work is batched by the CodecWorker.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.js import JetStreamContext

from messages import DecodeError
from messages.errors import ErrorCode
from messages.frames import CodesChunk, CodesEnd, CodesMessage, TakeoverMarker
from services.bus.pull_consumer import Delivery
from services.vocoder.audio import AudioPublisher
from services.vocoder.codec_worker import CodecWorker
from services.bus.codes_record import ack_floor, effective_codes, read_codes
from services.vocoder.errors import CodecFailure, MissingCodes, UndecodableCodes
from services.vocoder.request_end import TerminalPublisher
from services.vocoder.request_streams import RequestStream, StreamTable

log = logging.getLogger(__name__)

IN_PROGRESS_EVERY_CHUNKS = 16  # during a long rebuild, tell the server we are still working this often


class CodesHandler:
    """Handles one codes message of a request; owns no tasks (the caller serialises each request's messages)."""

    def __init__(self, js: JetStreamContext, table: StreamTable, codec: CodecWorker, audio: AudioPublisher,
                 terminal: TerminalPublisher, *, full_retry_delay_s: float = 0.5) -> None:
        self._js = js
        self.table = table
        self._codec = codec
        self._audio = audio
        self._terminal = terminal
        self.full_retry_delay_s = full_retry_delay_s
        self.num_deferred = 0  # messages put back because max_streams requests were in flight

    async def handle(self, partition: int, message: CodesMessage, delivery: Delivery) -> None:
        """Do the message's work and settle its delivery (ack, nak when at capacity, term when undecodable)."""
        request_id = message.request_id
        if self.table.has_ended(request_id):
            await delivery.ack()  # a late or redelivered message of a request this replica already ended
            return
        stream = self.table.get(request_id)
        if stream is None:
            if self.table.is_full():
                log.info("at max_streams (%d): request %s waits", self.table.max_streams, request_id)
                self.num_deferred += 1
                await delivery.nak(self.full_retry_delay_s)
                return
            # Into the table before any await, so that concurrent lanes see the slot taken.
            stream = self.table.add(RequestStream(request_id, partition, codec_state=None))
        async with stream.lock:
            if self.table.get(request_id) is not stream:  # ended while we waited (owner watch)
                await delivery.ack()
                return
            if stream.codec_state is None:
                stream.codec_state = await self._codec.new_stream()
            await self._handle_locked(stream, message, delivery)

    async def refuse(self, partition: int, error: DecodeError) -> None:
        """A codes message of a request that could not be decoded (already termed): without it the request's audio
        cannot be completed, so the request ends here with one `failed` terminal naming why, and its state goes."""
        request_id = error.request_id
        if request_id is None or self.table.has_ended(request_id):
            return
        stream = self.table.get(request_id) or self.table.add(RequestStream(request_id, partition, codec_state=None))
        async with stream.lock:
            if self.table.get(request_id) is stream:
                await self._fail(stream, error.code, f"the vocoder could not read a codes message of this request "
                                                     f"({error}); the audio cannot be completed. Retry the request.")

    async def _handle_locked(self, stream: RequestStream, message: CodesMessage, delivery: Delivery) -> None:
        try:
            if isinstance(message, TakeoverMarker):
                stream.note_epoch(message.epoch, message.replica)
                await delivery.ack()
            elif isinstance(message, CodesChunk):
                await self._on_chunk(stream, message, delivery)
            else:
                await self._on_end(stream, message, delivery)
        except UndecodableCodes as exc:
            log.error("terminating codes message %d of %s: %s", delivery.stream_sequence, stream.request_id, exc)
            await delivery.term(f"{exc.code}: {exc}")
            await self._fail(stream, exc.code, f"decode sent codes the vocoder cannot voice: {exc}. This is a bug "
                                               f"in the decode stage or a checkpoint mismatch between stages.")
        except (MissingCodes, CodecFailure) as exc:
            log.error("request %s: %s", stream.request_id, exc)
            await self._fail(stream, exc.code, f"{exc}; the audio cannot be completed. Retry the request.")
            await delivery.ack()

    async def _on_chunk(self, stream: RequestStream, chunk: CodesChunk, delivery: Delivery) -> None:
        if chunk.seq > stream.next_seq and not stream.is_stale(chunk.epoch):
            await self._catch_up(stream, delivery)
            if chunk.seq > stream.next_seq and not stream.is_stale(chunk.epoch):
                raise MissingCodes(f"codes chunks {stream.next_seq}..{chunk.seq - 1} are not in CODES")
        if stream.is_stale(chunk.epoch):
            log.info("ignoring chunk %d of epoch %d (epoch %d took over)", chunk.seq, chunk.epoch, stream.epoch)
        elif chunk.seq < stream.next_seq:
            log.debug("chunk %d was already voiced (redelivery)", chunk.seq)
        else:
            await self._voice(stream, chunk, publish=True)
        await delivery.ack()

    async def _on_end(self, stream: RequestStream, end: CodesEnd, delivery: Delivery) -> None:
        if stream.is_stale(end.epoch):
            log.info("ignoring CodesEnd of epoch %d (epoch %d took over)", end.epoch, stream.epoch)
            await delivery.ack()
            return
        if end.seq > stream.next_seq:
            await self._catch_up(stream, delivery)
        event = self._terminal.after_end(end, chunk_count=stream.next_seq, frames=stream.frames)
        await self._terminal.publish(event)
        self.table.release(stream.request_id, ended=True)
        await delivery.ack()

    async def _voice(self, stream: RequestStream, chunk: CodesChunk, *, publish: bool) -> None:
        """Decode one chunk into the stream's codec state; publish its audio when `publish`."""
        samples = await self._codec.decode(stream.codec_state, chunk.frames(), chunk.context_frames(),
                                           audio_in_hand_s=self._audio_in_hand_s(stream) if publish else 0.0)
        if publish:
            handed_at = time.time()
            await self._audio.publish(chunk, samples)
            if chunk.seq == 0 and not stream.first_audio_sent:
                stream.first_audio_sent = True
                stream.audio_started_at = asyncio.get_running_loop().time()
                await self._audio.first_audio(stream.request_id, handed_at)
        stream.advance(chunk)

    def _audio_in_hand_s(self, stream: RequestStream) -> float:
        """The stream's audio its listener has yet to play, if playback began when its first audio went out (0
        before that: a first chunk has none in hand)."""
        if stream.audio_started_at is None:
            return 0.0
        voiced_s = stream.frames * self._codec.samples_per_frame / self._codec.sample_rate
        return stream.audio_started_at + voiced_s - asyncio.get_running_loop().time()

    async def _catch_up(self, stream: RequestStream, delivery: Delivery) -> None:
        """Voice the chunks stored in CODES before this message that the stream has not voiced yet.

        Audio goes out only for chunks whose messages the partition's consumer has not acknowledged: an acknowledged
        chunk was voiced and published already (by this replica or the partition's previous owner), and the gateway
        asks for a re-decode if it lost one.
        """
        await delivery.in_progress()
        stored = await read_codes(self._js, stream.partition, stream.request_id,
                                  before_stream_seq=delivery.stream_sequence)
        record = effective_codes(stored)
        stream.note_epoch(record.epoch, record.owner)
        missing = record.chunks[stream.next_seq:]
        if not missing:
            return
        floor = await ack_floor(self._js, stream.partition)
        log.info("rebuilding %s from CODES: chunks %d..%d", stream.request_id, stream.next_seq,
                 stream.next_seq + len(missing) - 1)
        for count, item in enumerate(missing, 1):
            await self._voice(stream, item.message, publish=item.stream_seq > floor)
            if count % IN_PROGRESS_EVERY_CHUNKS == 0:
                await delivery.in_progress()

    async def _fail(self, stream: RequestStream, code: ErrorCode, reason: str) -> None:
        event = self._terminal.vocoder_failure(stream.request_id, code, reason, frames=stream.frames,
                                               chunk_count=stream.next_seq)
        await self._terminal.publish(event)
        self.table.release(stream.request_id, ended=True)
