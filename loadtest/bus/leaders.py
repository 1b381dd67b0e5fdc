"""Placing a cluster's stream and consumer leaders on one member (JetStream's leader step-down with a preferred
member), so a client of that member reaches every leader without crossing a route: what separates the quorum's
cost from the hop to a leader elsewhere."""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client

from messages import subjects

MOVE_TIMEOUT_S = 30.0
RETRY_S = 0.2  # an election's outcome is read back; nothing announces it to a client


async def _leader(nc: Client, stream: str, consumer: str | None) -> str | None:
    js = nc.jetstream()
    info = await (js.consumer_info(stream, consumer) if consumer else js.stream_info(stream))
    return info.cluster.leader if info.cluster is not None else None


async def move_leader(nc: Client, member: str, stream: str, consumer: str | None = None) -> str | None:
    """Ask `stream`'s (or its `consumer`'s) leader to step down in favour of `member` until `member` leads, within
    MOVE_TIMEOUT_S; returns the leader it ended with (another member when the cluster would not move it)."""
    subject = subjects.consumer_leader_stepdown(stream, consumer) if consumer else \
        subjects.stream_leader_stepdown(stream)
    body = json.dumps({"placement": {"preferred": member}}).encode()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MOVE_TIMEOUT_S
    leader = None
    while loop.time() < deadline:
        try:
            leader = await _leader(nc, stream, consumer)
            if leader == member:
                return leader
            await nc.request(subject, body, timeout=5.0)
        except Exception:  # noqa: BLE001 - mid-election answers (503, timeouts) are retried until the deadline
            pass
        await asyncio.sleep(RETRY_S)
    return leader
