"""The reads fencing rests on see the stream leader's state, not a lagging follower's.

`owner.<id>`, `lease.<replica>` (through `open_bucket`'s handle) and a subject's last sequence
(`last_subject_sequence`) are read with `$JS.API.STREAM.MSG.GET`, which only a stream's leader answers; a direct get
(`$JS.API.DIRECT.GET`), which nats-py uses for a bucket that allows it, may be answered by any replica. Shown on a bucket
that allows direct gets, two ways: the requests on the wire are leader-only ones, and a client connected only to a member that was down while the
writes were made (and is catching up) reads every one of them at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from messages import encode, subjects
from messages.permissions import JS_API
from messages.records import Lease
from messages.streams import BUCKET, CODES_STREAM, BusConfig
from services.bus import provision
from services.bus.claims import OwnerClaim, claim_request, read_owner
from services.bus.fencing import fenced_publish, last_subject_sequence
from services.bus.leases import read_lease
from services.bus.provision import bucket_stream, open_bucket
from tests.support.nats_cluster import ELECTION_TIMEOUT_S, client

CONFIG = BusConfig(models=("tiny",), num_partitions=1, stream_replicas=3)
WRITES = 20
CODES_SUBJECT = subjects.codes(0, "req-lag")


async def _fresh_bus(js) -> None:
    """Provisioned, emptied (purged: a stream deleted and made again at once may meet a member still removing its
    files), the bucket then allowing direct gets (as `nats kv add` makes one), so that nats-py's own handle would
    read from any replica."""
    await provision(js, CONFIG)
    for stream in (bucket_stream(BUCKET), CODES_STREAM):
        await js.purge_stream(stream)
    config = (await js.stream_info(bucket_stream(BUCKET))).config
    config.allow_direct = True
    await js.update_stream(config)
    assert (await js.key_value(BUCKET))._direct  # noqa: SLF001 - what nats-py would do with it


async def test_fencing_reads_are_requests_only_the_leader_answers(nats_cluster, cluster_client) -> None:
    js = cluster_client.jetstream()
    await _fresh_bus(js)
    kv = await open_bucket(js)
    seen: list[str] = []

    async def record(msg) -> None:
        seen.append(msg.subject)

    watcher = await cluster_client.subscribe(f"{JS_API}.>", cb=record)
    try:
        await read_owner(kv, "req-wire")
        await read_lease(kv, "decode-wire")
        await last_subject_sequence(js, CODES_STREAM, subjects.codes(0, "req-wire"))
        await cluster_client.flush()
    finally:
        await watcher.unsubscribe()
    gets = [subject for subject in seen if ".MSG.GET." in subject or ".DIRECT.GET." in subject]
    assert gets == [f"{JS_API}.STREAM.MSG.GET.{bucket_stream(BUCKET)}"] * 2 + [f"{JS_API}.STREAM.MSG.GET.{CODES_STREAM}"]


@dataclass
class Written:
    """The last of each kind of write, as their writer was acknowledged."""

    owner: OwnerClaim | None = None
    lease_revision: int = 0
    last_codes_sequence: int = 0


async def test_a_member_catching_up_serves_the_leaders_state(nats_cluster, cluster_client) -> None:
    js = cluster_client.jetstream()
    await _fresh_bus(js)
    kv_leader = await nats_cluster.stream_leader(cluster_client, bucket_stream(BUCKET))
    codes_leader = await nats_cluster.stream_leader(cluster_client, CODES_STREAM)
    lagging = next(index for index, member in enumerate(nats_cluster.cluster.members)
                   if member.name not in (kv_leader, codes_leader))
    lagging_url = nats_cluster.url_of(lagging)
    writer = await client(nats_cluster.url_of(nats_cluster.index_of(kv_leader)), "writer")
    try:
        nats_cluster.kill(lagging)
        written = await _write(writer.jetstream())  # acknowledged by the two live members, unseen by the third
    finally:
        await writer.close()
    await asyncio.to_thread(nats_cluster.restart, lagging)
    reader = await client(lagging_url, "lagging-member-client")
    try:
        reader_js = reader.jetstream()
        reader_kv = await asyncio.wait_for(open_bucket(reader_js), ELECTION_TIMEOUT_S)
        assert (await read_owner(reader_kv, "req-lag")) == written.owner
        lease = await read_lease(reader_kv, "decode-lag")
        assert lease is not None and lease.renewed_at == float(WRITES - 1)
        assert (await reader_kv.get(subjects.lease_key("decode-lag"))).revision == written.lease_revision
        assert await last_subject_sequence(reader_js, CODES_STREAM, CODES_SUBJECT) == written.last_codes_sequence
        assert reader.connected_url.port == int(lagging_url.rsplit(":", 1)[1])
    finally:
        await reader.close()


async def _write(js) -> Written:
    kv = await open_bucket(js)
    written = Written()
    for n in range(WRITES):
        written.owner = await claim_request(kv, "req-lag", f"decode-{n}", current=written.owner)
        written.lease_revision = await kv.put(subjects.lease_key("decode-lag"), encode(Lease(
            replica="decode-lag", service="decode", renewed_at=float(n), ttl_s=3.0)))
        ack = await fenced_publish(js, CODES_SUBJECT, b"chunk", stream=CODES_STREAM,
                                   expected=written.last_codes_sequence, msg_id=f"lag-{n}")
        assert ack is not None
        written.last_codes_sequence = ack.seq
    return written
