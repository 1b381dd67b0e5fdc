"""Messages and bytes per subject class on a running mesh's bus, read by one subscriber to `>` (the mesh's
operator may subscribe to everything), bounded by the caller's window.

A class is the subject with its data tokens (request ids, partitions, replica names) dropped: `tts.codes`,
`tts.audio`, `tts.events.<kind>`, `tts.req`, `$KV.voxmesh.<key kind>`, `$JS.API.<object>.<verb>`, `$JS.ACK`,
`_INBOX` (publish acks, pulled messages, replies), `$SRV`, and the first token of anything else. Bytes are payload
plus headers (each header counted as `name: value\\r\\n`), not NATS's protocol framing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg

HEADER_OVERHEAD = len(": \r\n")


def subject_class(subject: str) -> str:
    """The class `subject` is counted under (its data tokens dropped)."""
    tokens = subject.split(".")
    first = tokens[0]
    if first == "tts" and len(tokens) >= 2:
        if tokens[1] == "events" and len(tokens) >= 4:
            return f"tts.events.{tokens[3]}"
        return f"tts.{tokens[1]}"
    if first == "$KV" and len(tokens) >= 3:
        return f"$KV.{tokens[1]}.{tokens[2]}"
    if first == "$JS" and len(tokens) >= 2:
        if tokens[1] == "API":
            return ".".join(tokens[:4]) if tokens[2] in ("CONSUMER", "STREAM", "DIRECT") else ".".join(tokens[:3])
        return ".".join(tokens[:2])
    if first.startswith("_INBOX"):
        return "_INBOX"
    return first


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
        self.messages[name] += 1
        self.bytes[name] += message_bytes(msg)
        if name.startswith("tts.events."):
            self.request_ids.add(msg.subject.split(".")[2])

    @property
    def requests(self) -> int:
        return len(self.request_ids)

    def report(self, seconds: float) -> dict:
        """Totals, per second of the window, and per request seen, by class."""
        per = max(self.requests, 1)
        classes = {}
        for name in sorted(self.messages, key=lambda n: -self.bytes[n]):
            count, size = self.messages[name], self.bytes[name]
            classes[name] = {"messages": count, "bytes": size,
                             "messages_per_request": round(count / per, 2), "bytes_per_request": round(size / per),
                             "messages_per_s": round(count / seconds, 2), "bytes_per_s": round(size / seconds)}
        return {"seconds": round(seconds, 2), "requests": self.requests, "classes": classes}
