"""Answering RedecodeRequest on `tts.redecode.<n>`: voice a request again from CODES, from a chunk sequence on.

The replay reads the request's chunks that count (same epoch rules as the live path), decodes them in the same
chunking into a fresh codec state, and republishes the AudioChunks from `from_seq` on. Chunking is deterministic and
so is the codec, so the bytes are those of the first time. The reply goes out before any audio.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from messages import DecodeError, decode, encode, subjects
from messages.requests import RedecodeReply, RedecodeRequest
from services.bus.logs import request_context
from services.vocoder.audio import AudioPublisher
from services.vocoder.codec_worker import CodecWorker
from services.bus.codes_record import StoredCodes, effective_codes, read_codes

log = logging.getLogger(__name__)

UNKNOWN_REQUEST = "unknown"  # the reply's request id when the request itself could not be read


class Redecoder:
    """Serves re-decodes for the partitions this replica owns; every replay task is kept and cancelled on close."""

    def __init__(self, nc: Client, js: JetStreamContext, codec: CodecWorker, audio: AudioPublisher, *,
                 num_partitions: int, max_concurrent: int = 4) -> None:
        self._nc, self._js = nc, js
        self._codec = codec
        self._audio = audio
        self.num_partitions = num_partitions
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task] = set()
        self.num_served = 0

    async def subscribe(self, partition: int) -> Subscription:
        """Answer `tts.redecode.<partition>` until the returned subscription is unsubscribed."""

        async def on_request(msg: Msg) -> None:
            await self._on_request(partition, msg)

        return await self._nc.subscribe(subjects.redecode(partition), cb=on_request)

    async def _on_request(self, partition: int, msg: Msg) -> None:
        try:
            request = decode(msg.data, RedecodeRequest)
        except DecodeError as exc:
            await _reply(msg, RedecodeReply(request_id=UNKNOWN_REQUEST, accepted=False, reason=str(exc)))
            return
        with request_context(request.request_id):
            chunks, refusal = await self._chunks_for(partition, request)
            await _reply(msg, RedecodeReply(request_id=request.request_id, accepted=refusal is None, reason=refusal))
            if refusal is None:
                task = asyncio.get_running_loop().create_task(self._replay(request, chunks),
                                                               name=f"redecode-{request.request_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _chunks_for(self, partition: int, request: RedecodeRequest) -> tuple[list[StoredCodes], str | None]:
        """The chunks to replay, or why the request is refused."""
        home = subjects.partition_for(request.request_id, self.num_partitions)
        if home != partition:
            return [], f"request {request.request_id} is in partition {home}, not {partition}"
        record = effective_codes(await read_codes(self._js, partition, request.request_id))
        if not record.chunks and record.end is None:
            return [], f"CODES holds no codes of request {request.request_id} (not started, or expired)"
        return record.chunks, None

    async def _replay(self, request: RedecodeRequest, chunks: list[StoredCodes]) -> None:
        async with self._slots:
            try:
                state = await self._codec.new_stream()
                try:
                    for item in chunks:
                        samples = await self._codec.decode(state, item.message.frames(),
                                                           item.message.context_frames())
                        if item.message.seq >= request.from_seq:
                            await self._audio.publish(item.message, samples)
                finally:
                    state.release()
                self.num_served += 1
                log.info("re-decoded %s from seq %d (%d chunks)", request.request_id, request.from_seq,
                         max(0, len(chunks) - request.from_seq))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("re-decode of %s failed", request.request_id)

    async def close(self) -> None:
        """Cancel replays still running."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _reply(msg: Msg, reply: RedecodeReply) -> None:
    if msg.reply:
        await msg.respond(encode(reply))
