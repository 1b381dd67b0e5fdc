"""Migration, decode's side: where a request taken over from a dead decode replica stands in CODES.

Design (DESIGN.md, Liveness; README, Faults survived). A decode replica that dies stops renewing `lease.<replica>`.
The gateway's supervisor, which watches every request it admitted until its terminal event, sees the dead lease of
the request's owner and puts the request on REQUESTS again (once per dead owner epoch). Whichever decode replica
pulls it (one with room: another replica, or the dead one's restarted self, which has a new incarnation id and so
never mistakes the old claim for its own) resolves the claim by the owner's lease (`services.bus.claims`): a dead
owner's claim is taken over by compare-and-set on its exact revision, with the next epoch, so of two replicas that
pulled it only one wins. The winner then
1. reads the request's codes subject back (`read_resume`): the frames of every chunk that counts, the next chunk
   seq, and the subject's last stream sequence;
2. publishes a TakeoverMarker fenced on that last sequence, so from then on only the new epoch can append: a stale
   owner that comes back (paused, not dead) is refused by the server at its next append and stands down;
3. queues the request in its engine with those frames (`EngineRequest.frames`): the first prefill replays
   prompt + frames exactly as after a preemption (the frame inputs from all 16 codes and the text position; the
   sampler keyed by seed, frame and codebook), so the continuation equals an undisturbed run, and its chunks go on
   from the next seq with the same chunk rule, so the vocoder's audio chunks do too.
Each takeover is one migration (epoch - 1 of them so far). Past `--max-migrations` the request is not continued: a
request that crashes every replica it reaches must not take them all down. The replica that took it over past the
limit ends it in-band (marker, then CodesEnd failed `replica_lost`), and the vocoder publishes the one terminal after
the audio already made. A request whose CodesEnd or terminal is already stored is not taken over at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import DecodeError, decode, subjects
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.frames import NUM_CODEBOOKS, CodesChunk, CodesEnd, CodesMessage
from messages.streams import CODES_STREAM, EVENTS_STREAM
from services.bus.codes_record import effective_codes, read_codes
from services.bus.fencing import last_subject_sequence


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a request stands in CODES, for the owner that continues it.

    Attributes:
        frames: int64 [n, 16], every frame of the chunks that count, in order.
        next_seq: the seq of the next CodesChunk (chunks 0..next_seq-1 are in CODES).
        last_sequence: the subject's last stream sequence (0: empty): the TakeoverMarker's expectation.
    """

    frames: np.ndarray
    next_seq: int
    last_sequence: int

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @classmethod
    def fresh(cls) -> Resume:
        """A request with nothing in CODES yet."""
        return cls(np.zeros((0, NUM_CODEBOOKS), dtype=np.int64), 0, 0)


async def read_resume(js: JetStreamContext, partition: int, request_id: str) -> Resume:
    """The request's frames and chunk count as CODES holds them now (newest epoch wins, stale messages dropped).

    The last sequence is read first and the record up to it, so a marker fenced on it is refused if anything was
    appended after what was read."""
    subject = subjects.codes(partition, request_id)
    last = await last_subject_sequence(js, CODES_STREAM, subject)
    if last == 0:
        return Resume.fresh()
    record = effective_codes(await read_codes(js, partition, request_id, before_stream_seq=last + 1))
    chunks = [item.message for item in record.chunks if isinstance(item.message, CodesChunk)]
    frames = (np.concatenate([chunk.frames() for chunk in chunks]) if chunks
              else np.zeros((0, NUM_CODEBOOKS), dtype=np.int64))
    return Resume(frames, len(chunks), last)


async def has_ended(js: JetStreamContext, partition: int, request_id: str) -> bool:
    """True when the request needs no new owner: its terminal event is stored, or its codes end with a CodesEnd (the
    dead owner finished it; the vocoder publishes the terminal)."""
    try:
        await js.get_last_msg(EVENTS_STREAM, subjects.terminal(request_id))
        return True
    except NotFoundError:
        pass
    try:
        last = await js.get_last_msg(CODES_STREAM, subjects.codes(partition, request_id))
    except NotFoundError:
        return False
    try:
        return isinstance(decode(last.data, CodesMessage), CodesEnd)
    except DecodeError:
        return False


def past_limit_error(epoch: int, max_migrations: int, resume: Resume) -> ErrorInfo | None:
    """The `replica_lost` failure of a request owned at `epoch` past the migration limit (each epoch after the first
    is a takeover from a dead replica), or None within it."""
    migrations = epoch - 1
    if migrations <= max_migrations:
        return None
    message = (f"the decode replica serving this request died {migrations} times (--max-migrations "
               f"{max_migrations}): a request that keeps taking its replica down is not passed on again. The "
               f"{resume.next_seq} audio chunks already sent are valid; retry the request, and check the decode logs "
               "for this request id")
    return ErrorInfo(code=ErrorCode.REPLICA_LOST, stage=Stage.DECODE, message=message)
