"""Usage records read back from stream USAGE for a time range (the gateway's operator route reads them).

Through an ephemeral pull consumer that starts at the range's start (by stream time, less CLOCK_SLACK_S: a record's
`at` is the clock of the stage that ended the request, its stream time the server's) and reads to the end of the
stream, since a record is stored after its request ended, at most EVENTS' retention later if every gateway was down.
The consumer needs no ack and lapses by itself (INACTIVE_S): services may not delete consumers. A read costs one
message per request since the range's start; the totals are summed by services/usage/totals.py.
"""

from __future__ import annotations

import datetime
import logging

from nats.js import JetStreamContext, api

from messages import DecodeError, decode, subjects
from messages.streams import USAGE_STREAM
from messages.usage import UsageRecord

log = logging.getLogger(__name__)

CLOCK_SLACK_S = 300.0
"""How far before the range's start the read begins, for clocks that disagree between hosts."""
INACTIVE_S = 30.0
"""The read's consumer is removed by the server this long after its last fetch."""
BATCH = 512
FETCH_TIMEOUT_S = 5.0


async def read_usage(js: JetStreamContext, start: float) -> list[UsageRecord]:
    """Every usage record stored since `start` (unix seconds, less CLOCK_SLACK_S) until now."""
    since = datetime.datetime.fromtimestamp(max(0.0, start - CLOCK_SLACK_S), datetime.timezone.utc)
    config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=since,
                                ack_policy=api.AckPolicy.NONE, inactive_threshold=INACTIVE_S, mem_storage=True,
                                description="voxmesh usage read")
    subscription = await js.pull_subscribe(subjects.all_usage(), stream=USAGE_STREAM, config=config)
    try:
        left = (await subscription.consumer_info()).num_pending
        records: list[UsageRecord] = []
        while left > 0:
            for msg in await subscription.fetch(min(BATCH, left), timeout=FETCH_TIMEOUT_S):
                left = msg.metadata.num_pending
                try:
                    records.append(decode(msg.data, UsageRecord))
                except DecodeError as exc:
                    log.error("unreadable usage record on %s: %s", msg.subject, exc)
        return records
    finally:
        try:
            await subscription.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - a closed connection: the server drops the consumer anyway
            log.debug("usage read: unsubscribe failed: %r", exc)

