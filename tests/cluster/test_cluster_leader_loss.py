"""A stream's leader killed (SIGKILL) while a numbered sequence is published to it: the publishers retry through
the election with the same Msg-Id (`ack_retry`), and once a new leader serves, the stream holds each message exactly
once. For plain submits (REQUESTS, deduplicated by Msg-Id) and for fenced appends (CODES, each expecting the last
sequence: a retry whose first attempt landed is recognised as ours, never appended twice, never lost)."""

from __future__ import annotations

import asyncio
import logging

from messages import SynthesisRequest, decode, subjects
from messages.streams import CODES_STREAM, REQUESTS_STREAM, BusConfig
from services.bus import provision, submit_request
from services.bus.fencing import fenced_publish
from tests.support.nats_cluster import ELECTION_TIMEOUT_S, NatsCluster, client

CONFIG = BusConfig(models=("tiny",), num_partitions=1, stream_replicas=3, max_queued_requests=1000)
COUNT = 60
KILL_AFTER = 10


async def _emptied(js, stream: str) -> None:
    """The bus provisioned (idempotent) and `stream` purged. Not deleted and made again: a member restarted by the
    previous test may still be removing a deleted stream's files, and refuses to create one of the same name."""
    await provision(js, CONFIG)
    await js.purge_stream(stream)


async def _through_a_leader_kill(nats_cluster: NatsCluster, nc, stream: str, publish, caplog) -> None:
    """Run `publish(js, n)` for n in 0..COUNT-1, killing `stream`'s leader after KILL_AFTER acks; then bring it back.

    The publisher is a client of a member that survives, and it stops after KILL_AFTER acks until the kill is done:
    its next publish then meets the stream without a leader (no responders until the survivors elect, which takes an
    election timeout of seconds). A client of the killed member could instead reconnect only after the election and
    see nothing of it: the retry would go untested."""
    leader = await nats_cluster.stream_leader(nc, stream)
    killed = nats_cluster.index_of(leader)
    survivor = next(i for i in range(len(nats_cluster.urls)) if i != killed)
    publisher = await client(nats_cluster.urls[survivor], "cluster-test-publisher")
    js = publisher.jetstream()
    acked, kill_done = asyncio.Event(), asyncio.Event()

    async def publish_all() -> None:
        for n in range(COUNT):
            await publish(js, n)
            if n + 1 == KILL_AFTER:
                acked.set()
                await kill_done.wait()

    try:
        with caplog.at_level(logging.WARNING, logger="services.bus.ack_retry"):
            publishing = asyncio.create_task(publish_all())
            await asyncio.wait_for(acked.wait(), ELECTION_TIMEOUT_S)
            nats_cluster.kill(killed)
            kill_done.set()
            await asyncio.wait_for(publishing, 2 * ELECTION_TIMEOUT_S)
    finally:
        await publisher.close()
    assert any("retrying" in record.getMessage() for record in caplog.records), "the kill must meet a publish"
    assert await nats_cluster.stream_leader(nc, stream, not_on=leader) != leader
    await asyncio.to_thread(nats_cluster.restart, killed)
    await nats_cluster.wait_for_jetstream()


async def test_submits_through_a_leader_kill_are_stored_exactly_once(nats_cluster, cluster_client, caplog) -> None:
    js = cluster_client.jetstream()
    await _emptied(js, REQUESTS_STREAM)

    async def submit(publisher_js, n: int) -> None:
        await submit_request(publisher_js, SynthesisRequest(id=f"req-{n}", model="tiny", text="Numbered.", seed=n))

    await _through_a_leader_kill(nats_cluster, cluster_client, REQUESTS_STREAM, submit, caplog)
    info = await js.stream_info(REQUESTS_STREAM)
    assert info.state.messages == COUNT
    stored = [decode((await js.get_msg(REQUESTS_STREAM, seq=seq)).data, SynthesisRequest).id
              for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    assert sorted(stored) == sorted(f"req-{n}" for n in range(COUNT))


async def test_fenced_appends_through_a_leader_kill_are_stored_once_in_order(nats_cluster, cluster_client,
                                                                             caplog) -> None:
    js = cluster_client.jetstream()
    await _emptied(js, CODES_STREAM)
    subject = subjects.codes(0, "req-chain")
    last = 0

    async def append(publisher_js, n: int) -> None:
        nonlocal last
        ack = await fenced_publish(publisher_js, subject, f"chunk {n}".encode(), stream=CODES_STREAM, expected=last,
                                   msg_id=f"req-chain:{n}")
        assert ack is not None, f"append {n} was fenced out: nobody else writes this subject"
        last = ack.seq

    await _through_a_leader_kill(nats_cluster, cluster_client, CODES_STREAM, append, caplog)
    info = await js.stream_info(CODES_STREAM)
    assert info.state.messages == COUNT and info.state.last_seq == last
    stored = [(await js.get_msg(CODES_STREAM, seq=seq)).data for seq in range(info.state.first_seq, last + 1)]
    assert stored == [f"chunk {n}".encode() for n in range(COUNT)]
