"""The gateway's terminal feed on a real nats-server: it reads terminal events through JetStream, so a second terminal
that the stream's guard refused is never seen (a core subscriber does see it), and a terminal published while the
server restarts, before the gateway's consumer exists again, still arrives."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js.errors import APIError

from messages import decode, encode, subjects
from messages.events import Failed, Finished, TerminalEvent
from messages.streams import BusConfig
from services.bus import EmbeddedNats, connect
from services.bus.fencing import EXPECTED_LAST_SUBJECT_SEQUENCE
from services.bus.provision import provision
from services.bus.terminal_guard import publish_terminal
from services.gateway.requests.terminal_feed import TerminalFeed
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus)

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 20.0


def finished(request_id: str) -> Finished:
    return Finished(request_id=request_id, at=time.time(), frames=4, audio_seconds=0.32, chunk_count=2)


class Seen:
    """What a follower of the feed received, with a way to wait for it."""

    def __init__(self) -> None:
        self.events: list[TerminalEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: TerminalEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            while len(self.events) < count:
                self._changed.clear()
                await self._changed.wait()


async def test_a_refused_second_terminal_never_reaches_the_feed(gateway_bus):
    feed = TerminalFeed(gateway_bus.js)
    duplicate, later = Seen(), Seen()
    await feed.follow("twice", duplicate)
    await feed.follow("later", later)
    core = await gateway_bus.nc.subscribe(subjects.terminal("twice"), max_msgs=2)
    try:
        assert await publish_terminal(gateway_bus.js, "twice", finished("twice"))
        second = Failed(request_id="twice", at=time.time(), stage="vocoder", code="internal", reason="second")
        with pytest.raises(APIError):  # the stream refuses it ...
            await gateway_bus.js.publish(subjects.terminal("twice"), encode(second),
                                         headers={EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
        # ... but core NATS delivered it: a core subscriber sees two terminal events.
        received = [await core.next_msg(TIMEOUT_S) for _ in range(2)]
        assert [type(decode(m.data, TerminalEvent)) for m in received] == [Finished, Failed]
        # The feed delivers in stream order: once a later terminal arrived, anything before it would have too.
        assert await publish_terminal(gateway_bus.js, "later", finished("later"))
        await later.wait_for(1)
        assert [type(e) for e in duplicate.events] == [Finished]
    finally:
        await feed.close()


async def test_a_terminal_published_while_the_server_restarts_still_arrives(tmp_path):
    server = EmbeddedNats(tmp_path / "store")
    url = await asyncio.to_thread(server.start)
    port = int(url.rsplit(":", 1)[1])
    gateway = await connect(url, "feed-gateway")
    publisher = None
    feed = TerminalFeed(gateway.jetstream())
    before, during = Seen(), Seen()
    try:
        await provision(gateway.jetstream(), BusConfig(models=("m",), num_partitions=1, storage="file"))
        await feed.follow("before", before)
        await feed.follow("during", during)
        assert await publish_terminal(gateway.jetstream(), "before", finished("before"))
        await before.wait_for(1)

        await asyncio.to_thread(server.stop)  # the feed's consumer (in memory) goes with the server
        server = EmbeddedNats(tmp_path / "store", port=port)
        await asyncio.to_thread(server.start)
        publisher = await connect(url, "feed-publisher")
        assert await publish_terminal(publisher.jetstream(), "during", finished("during"))

        await during.wait_for(1)
        assert [e.request_id for e in during.events] == ["during"]
        assert [e.request_id for e in before.events] == ["before"]  # not replayed by the re-created consumer
    finally:
        await feed.close()
        for nc in (gateway, publisher):
            if nc is not None:
                await nc.close()
        await asyncio.to_thread(server.stop)
