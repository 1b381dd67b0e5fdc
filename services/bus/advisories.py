"""JetStream advisories the mesh reacts to. MaxDeliver exhaustion on REQUESTS becomes a `poison` failure
(the gateway's supervisor publishes it); this module makes the advisory observable as typed notices."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import subjects

log = logging.getLogger(__name__)


class MaxDeliveriesAdvisory(msgspec.Struct, frozen=True):
    """`io.nats.jetstream.advisory.v1.max_deliver`, as the server sends it (JSON)."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int
    type: str = ""


async def watch_max_deliveries(nc: Client, stream: str, consumer: str,
                               on_exhausted: Callable[[MaxDeliveriesAdvisory], Awaitable[None]]) -> Subscription:
    """Call `on_exhausted` for each message of `consumer` that ran out of deliveries. Unsubscribe to stop."""
    decoder = msgspec.json.Decoder(MaxDeliveriesAdvisory)

    async def on_message(msg: Msg) -> None:
        try:
            advisory = decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.error("ignoring malformed advisory on %s: %s", msg.subject, exc)
            return
        await on_exhausted(advisory)

    return await nc.subscribe(subjects.max_deliveries_advisory(stream, consumer), cb=on_message)


async def load_exhausted_message(js: JetStreamContext, advisory: MaxDeliveriesAdvisory) -> bytes | None:
    """The payload of the message the advisory names (still in the stream: it was never acked), or None if gone."""
    try:
        return (await js.get_msg(advisory.stream, advisory.stream_seq)).data
    except NotFoundError:
        return None
