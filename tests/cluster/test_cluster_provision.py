"""`--stream-replicas`: provisioning on a three-server cluster makes every stream, the KV bucket and the object
stores with three replicas, each with a leader, and changes the count of existing ones in place, their data kept."""

from __future__ import annotations

import asyncio

from nats.js.api import StreamInfo

from messages import SynthesisRequest, subjects
from messages.key_limits import LIMITS_BUCKET
from messages.streams import BusConfig, REQUESTS_STREAM
from messages.voice_clone import VOICES_STORE
from services.bus import provision, submit_request
from services.bus.object_store import open_object_store, read_object, write_object
from services.bus.provision import bucket_stream, object_store_stream, open_bucket
from tests.support.nats_cluster import ELECTION_TIMEOUT_S

KEPT_KEY = subjects.lease_key("kept")
CONFIG = BusConfig(models=("tiny",), num_partitions=2)
EVERY_STREAM = {"REQUESTS", "EVENTS", "CODES", "USAGE", bucket_stream("voxmesh"), bucket_stream(LIMITS_BUCKET),
                object_store_stream("voxmesh-ref-audio"), object_store_stream(VOICES_STORE)}


async def _empty(js) -> None:
    for info in await js.streams_info():
        await js.delete_stream(info.config.name)


async def _replicated(js, replicas: int) -> dict[str, StreamInfo]:
    """Every stream's info once all are listed and each has `replicas` copies, a leader and every follower current (a
    stream whose count was just changed copies its data to its new peers first, and is missing from the list while
    its peer set changes)."""
    async def settled() -> dict[str, StreamInfo]:
        while True:
            infos = {info.config.name: info for info in await js.streams_info()}
            if set(infos) == EVERY_STREAM and all(_is_settled(info, replicas) for info in infos.values()):
                return infos
            await asyncio.sleep(0.1)  # the API's answer is the event: nothing announces a finished catch-up

    return await asyncio.wait_for(settled(), ELECTION_TIMEOUT_S)


def _is_settled(info: StreamInfo, replicas: int) -> bool:
    followers = (info.cluster.replicas or []) if info.cluster is not None else []
    return (info.config.num_replicas == replicas and info.cluster is not None and bool(info.cluster.leader)
            and len(followers) == replicas - 1 and all(peer.current for peer in followers))


async def test_provision_makes_every_stream_bucket_and_store_with_three_replicas(cluster_client) -> None:
    js = cluster_client.jetstream()
    await _empty(js)
    await provision(js, BusConfig(models=CONFIG.models, num_partitions=2, stream_replicas=3))
    infos = await _replicated(js, 3)
    for info in infos.values():
        assert len({info.cluster.leader, *(peer.name for peer in info.cluster.replicas)}) == 3, info.cluster
    consumer = await js.consumer_info(REQUESTS_STREAM, "decode-tiny")
    assert consumer.cluster.leader and len(consumer.cluster.replicas or []) == 2  # it follows its stream


async def test_provision_changes_the_replica_count_in_place_keeping_the_data(cluster_client) -> None:
    js = cluster_client.jetstream()
    await _empty(js)
    await provision(js, CONFIG)
    assert {info.config.num_replicas for info in (await _replicated(js, 1)).values()} == {1}
    sequence = await submit_request(js, SynthesisRequest(id="kept", model="tiny", text="Still here.", seed=1))
    revision = await (await open_bucket(js)).put(KEPT_KEY, b"alive")
    await write_object(await open_object_store(js, VOICES_STORE), "kept-voice", b"voice bytes")

    await provision(js, BusConfig(models=CONFIG.models, num_partitions=2, stream_replicas=3))
    await _replicated(js, 3)
    assert (await js.get_msg(REQUESTS_STREAM, seq=sequence)).seq == sequence
    assert (await (await open_bucket(js)).get(KEPT_KEY)).revision == revision
    found = await read_object(await open_object_store(js, VOICES_STORE), "kept-voice")
    assert found is not None and found[1] == b"voice bytes"

    await provision(js, CONFIG)  # and back down to one, in place as well
    assert {info.config.num_replicas for info in (await _replicated(js, 1)).values()} == {1}
    assert (await (await open_bucket(js)).get(KEPT_KEY)).revision == revision
