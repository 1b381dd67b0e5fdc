"""Pull consumers against a real server: explicit acks, fetch only with room, term bad messages, MaxDeliver."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import msgspec

from messages import SynthesisRequest, decode, subjects
from messages.streams import REQUESTS_STREAM, BusConfig
from services.bus import Capacity, Delivery, PullConsumer, submit_request, watch_max_deliveries
from services.bus.advisories import load_exhausted_message
from services.bus.prompt_pull import PromptPull
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny",), num_partitions=1, max_queued_requests=16, request_max_deliver=3)
DIRECT = subjects.request("tiny")  # the queue of the one consumer these tests pull from (decode-tiny)
TIMEOUT_S = 10.0
LONG_FETCH_S = 60.0
"""A fetch timeout far past TIMEOUT_S: a message held until its fetch times out fails the test instead of passing late."""


def request(n: int) -> SynthesisRequest:
    return SynthesisRequest(id=f"req-{n}", model="tiny", text="Hello there.", seed=n)


class Serving:
    """A PullConsumer on the tiny model's requests, run as a task, with its handler's deliveries in a queue."""

    def __init__(self, nc, handler, capacity: Capacity, retry_delay_s: float = 1.0, on_refused=None,
                 fetch_timeout_s: float = 0.2, max_batch: int = 16, concurrent: bool = False) -> None:
        self.stop = asyncio.Event()
        self.consumer = PullConsumer(nc.jetstream(), nc, stream=REQUESTS_STREAM, durable="decode-tiny",
                                     message_type=SynthesisRequest, handler=handler, capacity=capacity,
                                     max_batch=max_batch, fetch_timeout_s=fetch_timeout_s,
                                     retry_delay_s=retry_delay_s, on_refused=on_refused, concurrent=concurrent)

    async def __aenter__(self) -> Serving:
        self.task = asyncio.create_task(self.consumer.run(self.stop))
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, TIMEOUT_S)


async def test_undecodable_message_is_termed_and_the_next_is_served(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    terminated = await nats_client.subscribe(subjects.terminated_advisory(REQUESTS_STREAM, "decode-tiny"))
    received: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.ack(confirmed=True)
        await received.put((message, delivery.num_delivered))

    await js.publish(subjects.request("tiny"), b"\x93not a request")
    await submit_request(js, request(1), subject=DIRECT)
    async with Serving(nats_client, handler, Capacity(4)) as serving:
        message, num_delivered = await asyncio.wait_for(received.get(), TIMEOUT_S)
        advisory = json.loads((await terminated.next_msg(TIMEOUT_S)).data)
    assert message == request(1) and num_delivered == 1
    assert serving.consumer.num_termed == 1 and received.empty()
    assert advisory["stream_seq"] == 1 and "bad_message" in advisory["reason"]
    info = await js.consumer_info(REQUESTS_STREAM, "decode-tiny")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0
    assert (await js.stream_info(REQUESTS_STREAM)).state.messages == 0


async def test_fetches_only_when_there_is_room(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    capacity = Capacity(1)
    received: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.ack(confirmed=True)
        await received.put(message.id)  # keeps its slot until the test releases it

    for n in range(3):
        await submit_request(js, request(n), subject=DIRECT)
    async with Serving(nats_client, handler, capacity):
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == "req-0"
        info = await js.consumer_info(REQUESTS_STREAM, "decode-tiny")
        assert (info.num_pending, info.num_ack_pending, capacity.room()) == (2, 0, 0)  # nothing fetched w/o room
        capacity.release()
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == "req-1"
        capacity.release()
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == "req-2"


async def test_a_failing_handler_gets_a_nak_and_a_redelivery(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    capacity = Capacity(2)
    deliveries: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await deliveries.put(delivery.num_delivered)
        if delivery.num_delivered == 1:
            raise RuntimeError("transient failure")
        await delivery.ack(confirmed=True)
        capacity.release()

    await submit_request(js, request(7), subject=DIRECT)
    async with Serving(nats_client, handler, capacity, retry_delay_s=0.05):
        assert await asyncio.wait_for(deliveries.get(), TIMEOUT_S) == 1
        assert await asyncio.wait_for(deliveries.get(), TIMEOUT_S) == 2
    assert capacity.room() == 2  # the failed attempt gave its slot back


class Logged(logging.Handler):
    """Resolves `seen` with the first record of this logger whose message starts with `prefix`."""

    def __init__(self, prefix: str) -> None:
        super().__init__(logging.WARNING)
        self.prefix = prefix
        self.seen: asyncio.Future = asyncio.get_running_loop().create_future()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix) and not self.seen.done():
            self.seen.set_result(record.getMessage())


async def test_a_redelivery_while_its_first_handler_runs_is_left_to_that_handler(nats_client) -> None:
    # The ack wait runs out while the first handler still works (on a cluster: its bus reads wait out a leader
    # election). The redelivery must not start a second handler of the same message beside the first.
    js = nats_client.jetstream()
    await fresh_bus(js, dataclasses.replace(CONFIG, request_ack_wait_s=0.3))
    handled: asyncio.Queue = asyncio.Queue()
    release_first, acked = asyncio.Event(), asyncio.Event()
    logged = Logged("message 1 on")
    logger = logging.getLogger("services.bus.pull_consumer")
    logger.addHandler(logged)

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await handled.put(delivery.num_delivered)
        await release_first.wait()
        await delivery.ack(confirmed=True)
        capacity.release()
        acked.set()

    capacity = Capacity(4)
    await submit_request(js, request(9), subject=DIRECT)
    try:
        async with Serving(nats_client, handler, capacity, concurrent=True) as serving:
            assert await asyncio.wait_for(handled.get(), TIMEOUT_S) == 1
            second = asyncio.ensure_future(handled.get())
            done, _ = await asyncio.wait([second, logged.seen], timeout=TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            assert logged.seen in done and second not in done, "a second handler ran beside the first"
            release_first.set()
            await asyncio.wait_for(acked.wait(), TIMEOUT_S)
            info = await js.consumer_info(REQUESTS_STREAM, "decode-tiny")  # the ack above was confirmed
            second.cancel()
    finally:
        logger.removeHandler(logged)
    assert "redelivered while its earlier delivery is still handled here" in logged.seen.result()
    assert serving.consumer.num_redelivered_in_hand >= 1 and capacity.room() == 4
    assert info.delivered.consumer_seq >= 2 and info.num_ack_pending == 0  # delivered twice, settled once


async def test_max_deliver_exhaustion_is_observable(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    exhausted: asyncio.Queue = asyncio.Queue()
    await watch_max_deliveries(nats_client, REQUESTS_STREAM, "decode-tiny", exhausted.put)
    capacity = Capacity(1)

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.nak()  # always retryable: never succeeds
        capacity.release()

    await submit_request(js, request(3), subject=DIRECT)
    async with Serving(nats_client, handler, capacity):
        advisory = await asyncio.wait_for(exhausted.get(), TIMEOUT_S)
    assert (advisory.stream, advisory.consumer, advisory.deliveries) == (REQUESTS_STREAM, "decode-tiny", 3)
    poisoned = decode(await load_exhausted_message(js, advisory), SynthesisRequest)
    assert poisoned.id == "req-3"


async def test_stop_event_ends_an_idle_loop(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    stop = asyncio.Event()
    consumer = PullConsumer(js, nats_client, stream=REQUESTS_STREAM, durable="decode-tiny",
                            message_type=SynthesisRequest, handler=None, capacity=Capacity(1), fetch_timeout_s=0.2)
    task = asyncio.create_task(consumer.run(stop))
    stop.set()
    await asyncio.wait_for(task, TIMEOUT_S)
    assert task.done() and task.exception() is None


async def test_a_refused_message_naming_a_request_is_handed_to_its_owner(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    refused: asyncio.Queue = asyncio.Queue()
    received: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.ack(confirmed=True)
        await received.put(message.id)

    async def on_refused(error) -> None:
        await refused.put((error.request_id, error.code.value))

    await js.publish(subjects.request("tiny"), msgspec.msgpack.encode(
        {"type": "synthesis_request", "schema": 9, "id": "req-v9", "model": "tiny", "text": "Hi."}))
    await js.publish(subjects.request("tiny"), msgspec.msgpack.encode(
        {"type": "synthesis_request", "schema": 1, "id": "req-empty", "model": "tiny", "text": ""}))
    await js.publish(subjects.request("tiny"), b"\x93not a request")  # no readable id: termed and counted only
    await submit_request(js, request(1), subject=DIRECT)
    async with Serving(nats_client, handler, Capacity(4), on_refused=on_refused) as serving:
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == "req-1"
    assert [refused.get_nowait() for _ in range(refused.qsize())] == [("req-v9", "unsupported_version"),
                                                                      ("req-empty", "bad_message")]
    assert serving.consumer.num_termed == 3
    assert serving.consumer.num_termed_by_code == {"unsupported_version": 1, "bad_message": 2}
    assert (await js.stream_info(REQUESTS_STREAM)).state.messages == 0


async def test_a_lone_message_is_handed_over_without_waiting_for_the_rest_of_the_batch(nats_client) -> None:
    # nats-py's fetch(64) held a message that reached its waiting pull request until the fetch timed out (waiting
    # for 63 more): up to 1 s of a request's admission, and of its codes' way to the vocoder, at low load.
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    received: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.ack(confirmed=True)
        await received.put(message.id)

    serving = Serving(nats_client, handler, Capacity(64), fetch_timeout_s=LONG_FETCH_S, max_batch=64)
    task = asyncio.create_task(serving.consumer.run(serving.stop))
    try:
        for n in range(3):  # each published while the consumer's pull request waits at the server
            await until_a_pull_waits(js)
            await submit_request(js, request(n), subject=DIRECT)
            assert await asyncio.wait_for(received.get(), TIMEOUT_S) == f"req-{n}"
    finally:
        task.cancel()  # a stop would wait for the pull in flight, up to LONG_FETCH_S
        await asyncio.gather(task, return_exceptions=True)


async def test_a_waiting_pull_asks_for_one_message_and_takes_the_rest_without_waiting(nats_client) -> None:
    # The mechanism behind the test above, seen on the wire: nats-py's fetch(64) sent lingering requests for 64, and
    # the server holds such a request (and the fetch its first message) until 64 arrive or it expires.
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    pulls: list[dict] = []
    enough = asyncio.Event()

    async def observe(msg) -> None:
        pulls.append(json.loads(msg.data))
        if len(pulls) >= 6:
            enough.set()

    await nats_client.subscribe(subjects.consumer_next(REQUESTS_STREAM, "decode-tiny"), cb=observe)
    await nats_client.flush()  # the observer is in place at the server before the consumer asks
    received: asyncio.Queue = asyncio.Queue()

    async def handler(message: SynthesisRequest, delivery: Delivery) -> None:
        await delivery.ack(confirmed=True)
        await received.put(message.id)

    async with Serving(nats_client, handler, Capacity(64), max_batch=64):
        for n in range(3):
            await submit_request(js, request(n), subject=DIRECT)
            assert await asyncio.wait_for(received.get(), TIMEOUT_S) == f"req-{n}"
        await asyncio.wait_for(enough.wait(), TIMEOUT_S)
    lingering = [pull for pull in pulls if "expires" in pull]
    assert lingering and all(pull["batch"] == 1 and not pull.get("no_wait") for pull in lingering), pulls
    assert all(pull.get("no_wait") for pull in pulls if "expires" not in pull), pulls


async def until_a_pull_waits(js) -> None:
    """Until the server holds a pull request of the consumer (polled: the server announces none)."""
    for _ in range(int(TIMEOUT_S / 0.01)):
        if (await js.consumer_info(REQUESTS_STREAM, "decode-tiny")).num_waiting > 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no pull request reached the server")


async def test_a_pull_takes_what_is_stored_up_to_its_batch_and_waits_only_for_the_first(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    for n in range(5):
        await submit_request(js, request(n), subject=DIRECT)
    pull = PromptPull(nats_client, REQUESTS_STREAM, "decode-tiny")
    await pull.open()
    try:
        first = await asyncio.wait_for(pull.fetch(3, LONG_FETCH_S), TIMEOUT_S)
        rest = await asyncio.wait_for(pull.fetch(3, LONG_FETCH_S), TIMEOUT_S)  # 2 stored: no wait for a third
        for message in first + rest:
            await message.ack()
        assert [decode(m.data, SynthesisRequest).id for m in first + rest] == [f"req-{n}" for n in range(5)]
        assert [len(first), len(rest)] == [3, 2]
        assert await pull.fetch(4, 0.2) == []  # nothing stored: empty once the lingering request expires
    finally:
        await pull.close()
