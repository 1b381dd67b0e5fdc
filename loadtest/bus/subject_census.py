"""Messages and bytes per subject class on a running mesh's bus, read by one subscriber to `>` (the mesh's
operator may subscribe to everything), bounded by the caller's window.

A class is the subject with its data tokens (request ids, partitions, replica names) dropped: `tts.codes`,
`tts.audio`, `tts.events.<kind>`, `tts.req`, `$KV.voxmesh.<key kind>`, `$JS.API.<object>.<verb>`,
`$JS.ACK.<stream>`, `_INBOX` (publish acks, API replies, a pull's status replies), `$SRV.<verb>`, and the first
token of anything else. A message JetStream delivers to a consumer (its reply subject is the consumer's ack subject)
is counted apart, under its class with ` delivered` after it: a consumer's messages come with their stored subject,
so one stored codes chunk is seen twice, once published and once delivered. Bytes are payload plus headers (each
header counted as `name: value\\r\\n`), not NATS's protocol framing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg

from loadtest.bus.stream_shape import BYTES_PER_SAMPLE, SAMPLE_RATE_HZ
from messages import subjects

HEADER_OVERHEAD = len(": \r\n")
_PRODUCT_ROOT = subjects.REQUESTS_ROOT.split(".")[0]
DELIVERED = " delivered"


def subject_class(subject: str) -> str:
    """The class `subject` is counted under (its data tokens dropped)."""
    tokens = subject.split(".")
    if subject.startswith(subjects.EVENTS_ROOT + "."):
        return f"{subjects.EVENTS_ROOT}.{tokens[-1]}"  # the event's kind
    if tokens[0] == _PRODUCT_ROOT:
        return ".".join(tokens[:2])  # requests, codes, audio, mtp, admin...: the ids and partitions dropped
    if tokens[0].startswith("$"):  # JetStream's API and acks, the bucket's keys, micro discovery
        return ".".join(tokens[:4] if len(tokens) > 1 and tokens[1] in ("API", "EVENT") else tokens[:3])
    if tokens[0].startswith("_INBOX"):
        return "_INBOX"
    return tokens[0]


def message_bytes(msg: Msg) -> int:
    """Payload and header bytes of `msg`."""
    headers = msg.headers or {}
    return len(msg.data) + sum(len(k) + len(v) + HEADER_OVERHEAD for k, v in headers.items())


@dataclass
class Census:
    """Counts per class while subscribed, and the requests seen (distinct ids on `tts.events.<id>.<kind>`: every
    publish is seen, refused ones too, e.g. a second stage's terminal event that the guard turned away)."""

    messages: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    request_ids: set[str] = field(default_factory=set)
    _subscription: object | None = None

    async def start(self, nc: Client) -> None:
        self._subscription = await nc.subscribe(">", cb=self._count, pending_msgs_limit=1 << 20,
                                                pending_bytes_limit=1 << 30)
        await nc.flush()

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _count(self, msg: Msg) -> None:
        name = subject_class(msg.subject)
        if msg.reply and msg.reply.startswith(subjects.delivery_ack_prefix()):
            name += DELIVERED
        self.messages[name] += 1
        self.bytes[name] += message_bytes(msg)
        if msg.subject.startswith(subjects.EVENTS_ROOT + "."):
            self.request_ids.add(msg.subject.split(".")[2])

    @property
    def requests(self) -> int:
        return len(self.request_ids)

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio that crossed the bus: `tts.audio` bytes over 24 kHz s16le (each chunk's few dozen
        bytes of envelope counted as audio: under 0.5% of a chunk)."""
        return self.bytes.get(f"{subjects.AUDIO_ROOT}", 0) / float(SAMPLE_RATE_HZ * BYTES_PER_SAMPLE)

    def report(self, seconds: float) -> dict:
        """Totals, per second of the window, per request seen and per second of audio, by class."""
        per = max(self.requests, 1)
        audio_s = self.audio_seconds or 1.0
        classes = {}
        for name in sorted(self.messages, key=lambda n: -self.bytes[n]):
            count, size = self.messages[name], self.bytes[name]
            classes[name] = {"messages": count, "bytes": size,
                             "messages_per_request": round(count / per, 2), "bytes_per_request": round(size / per),
                             "messages_per_s": round(count / seconds, 2), "bytes_per_s": round(size / seconds),
                             "messages_per_audio_s": round(count / audio_s, 3), "bytes_per_audio_s": round(size / audio_s)}
        return {"seconds": round(seconds, 2), "requests": self.requests, "audio_seconds": round(self.audio_seconds, 2),
                "classes": classes}
