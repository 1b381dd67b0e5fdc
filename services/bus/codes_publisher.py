"""Appending a request's codes under its owner's epoch, fenced so that a stale owner is refused by the server."""

from __future__ import annotations

from nats.js import JetStreamContext

from messages import encode, subjects
from messages.base import InvalidMessage
from messages.frames import CodesChunk, CodesEnd, TakeoverMarker
from messages.streams import CODES_STREAM
from services.bus.errors import OwnershipConflict, StaleOwner
from services.bus.fencing import fenced_publish


class CodesPublisher:
    """The one writer of `tts.codes.<partition>.<id>` for an owner epoch.

    Every publish expects the subject's last sequence to be the one this publisher last wrote (or read, on takeover);
    when another owner has appended since, the server refuses and `publish` raises StaleOwner.
    """

    def __init__(self, js: JetStreamContext, *, partition: int, request_id: str, epoch: int,
                 last_sequence: int = 0, headers: dict[str, str] | None = None) -> None:
        self._js = js
        self.subject = subjects.codes(partition, request_id)
        self.request_id = request_id
        self.epoch = epoch
        self.last_sequence = last_sequence
        self._headers = headers

    @classmethod
    async def take_over(cls, js: JetStreamContext, *, partition: int, request_id: str, epoch: int, replica: str,
                        last_sequence: int, resume_frame: int, next_seq: int,
                        headers: dict[str, str] | None = None) -> CodesPublisher:
        """Become the writer: publish a TakeoverMarker expecting `last_sequence` (the last one the caller read).

        Raises OwnershipConflict if the subject moved past `last_sequence` meanwhile (re-read CODES and retry).
        """
        publisher = cls(js, partition=partition, request_id=request_id, epoch=epoch, last_sequence=last_sequence,
                        headers=headers)
        marker = TakeoverMarker(request_id=request_id, epoch=epoch, replica=replica, resume_frame=resume_frame,
                                next_seq=next_seq)
        try:
            await publisher.publish(marker)
        except StaleOwner as exc:
            raise OwnershipConflict(f"codes of {request_id} moved past sequence {last_sequence} during takeover "
                                    f"by {replica} (epoch {epoch}): re-read CODES and retry") from exc
        return publisher

    async def publish(self, message: CodesChunk | CodesEnd | TakeoverMarker) -> int:
        """Append one message; returns its stream sequence. Raises StaleOwner when fenced out."""
        if message.request_id != self.request_id or message.epoch != self.epoch:
            raise InvalidMessage(f"{type(message).__name__} for {message.request_id} epoch {message.epoch} given "
                                 f"to the publisher of {self.request_id} epoch {self.epoch}")
        ack = await fenced_publish(self._js, self.subject, encode(message), stream=CODES_STREAM,
                                   expected=self.last_sequence, msg_id=_msg_id(message), headers=self._headers)
        if ack is None:
            raise StaleOwner(f"{self.subject}: epoch {self.epoch} was fenced out (another owner appended after "
                             f"sequence {self.last_sequence}); standing down",
                             subject=self.subject, expected_sequence=self.last_sequence)
        self.last_sequence = ack.seq
        return ack.seq


def _msg_id(message: CodesChunk | CodesEnd | TakeoverMarker) -> str:
    if isinstance(message, CodesChunk):
        return f"{message.request_id}:codes:{message.seq}:e{message.epoch}"
    if isinstance(message, CodesEnd):
        return f"{message.request_id}:end:e{message.epoch}"
    # The position too: an owner that resumes its own epoch further on (its claim's message was redelivered) writes a
    # new marker there, which the duplicate window must not take for the first one.
    return f"{message.request_id}:takeover:e{message.epoch}:s{message.next_seq}"
