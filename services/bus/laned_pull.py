"""Pulling one model's decode work from its request lanes: interactive before batch, lanes of a priority in turn.

REQUESTS holds a model's decode work in several queues (`messages.streams.request_lanes`): the direct queue
(hand-offs from prefill, requests from before priorities) and, per priority, TENANT_LANES lanes keyed by a hash of
the tenant. Each round of `fetch`:
1. a census: one STREAM.INFO of REQUESTS filtered to the model's request subjects gives how many requests each lane
   holds (a work queue keeps a message until it is acked, so a request another replica is claiming right now still
   counts: its fetch then comes back short, which costs a round, never a request);
2. a plan (`LanePicker`): interactive lanes first, as far as free seats allow; batch lanes only as far as the seats
   not kept for interactive work allow; the lanes of one priority in turn;
3. a no-wait pull of that many from each planned lane's consumer (`PromptPull.take_stored`), all at once;
4. when that took nothing but the doorbell (below) rang for some lanes before the census, a lingering pull of one
   from each of them: the server hands a publish to subscribers a moment before its stream has stored it, so the
   census can miss the very request that rang.
A round that follows a round which took nothing skips the census when the doorbell rang meanwhile: nothing was
takeable then, so what rang is the new work, and a lingering pull of one from each lane it rang for (as in step 4,
within the seats free) takes it a round trip sooner; the round after it takes the census again, which finds whatever
else arrived. A request into an idle replica, one stream at a time, spends no census at all.
When there is nothing to take (or nothing this replica may take now), it waits for a doorbell: a core subscription
to the model's request subjects rings on every publish, and a released seat (`Capacity.wait_released`) ends the
wait too; `timeout_s` bounds it (redeliveries after a nak or an expired ack wait ring no doorbell). A census the
bus cannot answer (a leader election, a reconnect) costs a round, never the intake.

Nothing is held outside JetStream: a request is taken only when a seat is free for it, and the consumer keeps it
unacked until decode claims it, so a replica that dies between the pull and the claim leaves it to redelivery.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from messages import subjects
from messages.streams import RequestLane
from services.bus.errors import NotProvisioned
from services.bus.lane_picker import LanePicker
from services.bus.prompt_pull import INBOX_PENDING_MSGS, PromptPull
from services.bus.pull_consumer import Capacity

log = logging.getLogger(__name__)

STORE_LAG_S = 0.1
"""How long a round waits for a request its doorbell announced to be stored (it is stored within a millisecond or
so of the announcement on one server; another replica taking it first costs this much of one round)."""


class LanedPull:
    """The fetch side of a PullConsumer over several lanes (same `open`/`close`/`fetch` as PromptPull).

    `capacity` answers `room_for(priority)` (seats this replica may still fill with that priority's work),
    `floor_for(priority)` (seats kept for it while it has work) and `clear_released()` / `wait_released()`."""

    def __init__(self, js: JetStreamContext, nc: Client, *, stream: str, model: str, lanes: Sequence[RequestLane],
                 capacity: Capacity) -> None:
        self._js, self._nc, self.stream, self.model = js, nc, stream, model
        self.picker = LanePicker(lanes, subjects.PRIORITIES)
        self._capacity = capacity
        self._pulls: dict[str, PromptPull] = {}
        self._durable_of = {subject: lane.durable for lane in lanes for subject in lane.subjects}
        """Each lane subject -> its consumer, to read the census by."""
        self._doorbell = asyncio.Event()
        self._rung: set[str] = set()
        """The lanes (durable names) the doorbell rang for since the last round began."""
        self._doorbell_subs: list[Subscription] = []
        self._took_nothing = False
        """The last round took nothing: a doorbell since then announces the only work there is to take."""
        self.num_rounds = 0
        """Fetch rounds (census + plan, or a doorbell's pull), for tests and stats."""
        self.num_censuses = 0
        """Censuses taken (a round after an idle one may skip its census), for tests and stats."""

    async def open(self) -> None:
        """Check every lane's consumer exists (NotProvisioned if one does not), open its pull, ring the doorbell on
        every request published for the model."""
        for lane in self.picker.lanes:
            try:
                await self._js.consumer_info(self.stream, lane.durable)
            except NotFoundError as exc:
                raise NotProvisioned(f"consumer {lane.durable} on stream {self.stream} does not exist: run "
                                     "`voxmesh provision` (this version of decode pulls from every priority lane)") \
                    from exc
            pull = PromptPull(self._nc, self.stream, lane.durable)
            await pull.open()
            self._pulls[lane.durable] = pull
        for subject in (subjects.request(self.model), subjects.requests_of_model(self.model)):
            self._doorbell_subs.append(await self._nc.subscribe(subject, cb=self._ring,
                                                                pending_msgs_limit=INBOX_PENDING_MSGS))

    async def close(self) -> None:
        pulls, self._pulls = self._pulls, {}
        subs, self._doorbell_subs = self._doorbell_subs, []
        for sub in subs:
            await sub.unsubscribe()
        for pull in pulls.values():
            await pull.close()

    async def _ring(self, msg: Msg) -> None:
        durable = self._durable_of.get(msg.subject)
        if durable is not None:
            self._rung.add(durable)
        self._doorbell.set()

    async def fetch(self, batch: int, timeout_s: float) -> list[Msg]:
        """Up to `batch` requests, chosen by the lanes' census and the seats free per priority; waits up to
        `timeout_s` (for a publish or a freed seat) and returns nothing when there is nothing to take now."""
        rung, self._rung = self._rung, set()
        self._doorbell.clear()  # before the census: a publish from here on rings again
        self._capacity.clear_released()
        self.num_rounds += 1
        if self._took_nothing and rung:
            taken = await self._pull_rung(rung, batch)
            if taken:
                self._took_nothing = False
                return taken
            rung = set()  # another replica took what rang: the census finds anything else
        try:
            pending = await self._census()
        except (nats.errors.Error, asyncio.TimeoutError) as error:
            # No census while the stream elects a leader or the connection is reconnecting: one round lost, then
            # the next; the pulls themselves are core publishes, which the client keeps across a reconnect.
            log.warning("no census of %s's lanes (%r); retrying in %.1fs", self.model, error, timeout_s)
            await self._wait(timeout_s)
            return []
        plan = self.picker.plan(pending, *self._seats(batch))
        taken = await self._take(plan, timeout_s)
        if not taken and rung:
            # The doorbell rang for these lanes before the census, which did not find their requests (or their
            # consumers did not yet have them): the server routes a message to subscribers a moment before its
            # stream has stored it.
            taken = await self._pull_rung(rung, batch)
        self._took_nothing = not taken
        if not taken:
            await self._wait(timeout_s)
        return taken

    async def _pull_rung(self, rung: set[str], batch: int) -> list[Msg]:
        """A lingering pull of one from each lane the doorbell rang for, as far as the seats free now allow: it takes
        a request the moment its stream has stored it."""
        late = self.picker.plan(dict.fromkeys(rung, 1), *self._seats(batch))
        got = await asyncio.gather(*(self._pulls[lane.durable].fetch(1, STORE_LAG_S) for lane, _ in late))
        return [msg for msgs in got for msg in msgs]

    def _seats(self, batch: int) -> tuple[dict[str, int], dict[str, int]]:
        """Per priority: the requests this round may take (room, at most `batch`), and the seats kept for it."""
        rooms = {p: min(batch, self._capacity.room_for(p)) for p in subjects.PRIORITIES}
        floors = {p: self._capacity.floor_for(p) for p in subjects.PRIORITIES}
        return rooms, floors

    async def _take(self, plan: list[tuple[RequestLane, int]], timeout_s: float) -> list[Msg]:
        """What each planned lane has stored now, up to its count."""
        got = await asyncio.gather(*(self._pulls[lane.durable].take_stored(count, timeout_s) for lane, count in plan))
        return [msg for msgs in got for msg in msgs]

    async def _census(self) -> dict[str, int]:
        """Requests held per lane consumer (by durable name)."""
        self.num_censuses += 1
        info = await self._js.stream_info(self.stream, subjects_filter=f"{subjects.REQUESTS_ROOT}.>")
        held: dict[str, int] = {}
        for subject, count in (info.state.subjects or {}).items():
            durable = self._durable_of.get(subject)
            if durable is not None:
                held[durable] = held.get(durable, 0) + count
        return held

    async def _wait(self, timeout_s: float) -> None:
        """Until a request is published for the model, a seat is released, or `timeout_s`."""
        waits = [asyncio.ensure_future(self._doorbell.wait()), asyncio.ensure_future(self._capacity.wait_released())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

