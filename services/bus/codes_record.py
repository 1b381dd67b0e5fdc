"""Reading a request's record back from the CODES stream, and which of its chunks count.

Used to rebuild a codec state (after a partition takeover, or a gap in delivery) and to re-decode. Audio is a pure
function of the chunks that count: in stream order, drop chunks from an owner epoch older than the newest
TakeoverMarker seen so far, and drop repeated seqs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode, subjects
from messages.frames import CodesChunk, CodesEnd, CodesMessage, TakeoverMarker
from messages.streams import CODES_STREAM, codes_consumer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredCodes:
    """One codes message as stored in CODES."""

    stream_seq: int
    message: CodesMessage


@dataclass(frozen=True, slots=True)
class CodesRecord:
    """What counts of a request's codes, in order.

    Attributes:
        chunks: the chunks to voice, seq 0, 1, 2... (with their stream sequences).
        epoch: the newest owner epoch seen.
        owner: the replica of the newest TakeoverMarker, if any.
        end: the CodesEnd of the newest epoch, if one was read.
    """

    chunks: list[StoredCodes]
    epoch: int
    owner: str | None
    end: CodesEnd | None


async def read_codes(js: JetStreamContext, partition: int, request_id: str, *,
                     before_stream_seq: int | None = None) -> list[StoredCodes]:
    """Every decodable message on the request's codes subject, in stream order, stopping before `before_stream_seq`.

    Undecodable messages are skipped (the live consumer terms them).
    """
    subject = subjects.codes(partition, request_id)
    found: list[StoredCodes] = []
    next_seq = 1
    while before_stream_seq is None or next_seq < before_stream_seq:
        try:
            raw = await js.get_msg(CODES_STREAM, seq=next_seq, subject=subject, next=True)
        except NotFoundError:
            break
        if before_stream_seq is not None and raw.seq >= before_stream_seq:
            break
        next_seq = raw.seq + 1
        try:
            found.append(StoredCodes(raw.seq, decode(raw.data, CodesMessage)))
        except DecodeError as exc:
            log.warning("skipping undecodable message %d on %s: %s", raw.seq, subject, exc)
    return found


def effective_codes(stored: list[StoredCodes]) -> CodesRecord:
    """The chunks that count, the newest epoch and owner, and the end (if any) of a request's stored codes."""
    chunks: list[StoredCodes] = []
    epoch, owner, end = 0, None, None
    for item in stored:
        message = item.message
        if isinstance(message, TakeoverMarker):
            if message.epoch >= epoch:
                epoch, owner = message.epoch, message.replica
            continue
        if message.epoch < epoch:
            continue  # a stale owner's message
        epoch = message.epoch
        if isinstance(message, CodesEnd):
            end = message
        elif isinstance(message, CodesChunk) and message.seq == len(chunks):
            chunks.append(item)
        elif isinstance(message, CodesChunk) and message.seq > len(chunks):
            log.warning("codes of %s jump from seq %d to %d at stream sequence %d", message.request_id,
                        len(chunks), message.seq, item.stream_seq)
            break
    return CodesRecord(chunks, epoch, owner, end)


async def ack_floor(js: JetStreamContext, partition: int) -> int:
    """The stream sequence up to which the partition's consumer has every message acknowledged."""
    info = await js.consumer_info(CODES_STREAM, codes_consumer(partition))
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0
