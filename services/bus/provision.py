"""One administrative step that creates (or brings up to date) every stream, consumer, the KV bucket and the object
stores.

Idempotent: running it again on a provisioned server changes nothing. Services never call it; they bind with
`open_bucket`/`PullConsumer.bind` and get NotProvisioned when something is missing.

Replication (`BusConfig.stream_replicas`): every stream, the bucket (stream KV_<bucket>) and the object stores
(OBJ_<store>) get that many copies, each a RAFT group on as many servers of a JetStream cluster. A stream, bucket or
store that exists with another count is changed in place (JetStream moves its data to the new peer set and keeps
serving); the consumers inherit their stream's count, so they follow it.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE
from nats.js.kv import KeyValue
from nats.js.object_store import OBJ_STREAM_TEMPLATE

from messages.streams import BucketSpec, BusConfig, ConsumerSpec, ObjectStoreSpec, StreamSpec
from services.bus.ack_retry import retrying
from services.bus.errors import NotProvisioned, ProvisionConflict

log = logging.getLogger(__name__)

_RETENTION = {"workqueue": api.RetentionPolicy.WORK_QUEUE, "limits": api.RetentionPolicy.LIMITS}
_DISCARD = {"old": api.DiscardPolicy.OLD, "new": api.DiscardPolicy.NEW}
_STORAGE = {"file": api.StorageType.FILE, "memory": api.StorageType.MEMORY}


def bucket_stream(bucket: str) -> str:
    """The stream that holds a KV bucket (JetStream's convention, ADR-8)."""
    return KV_STREAM_TEMPLATE.format(bucket=bucket)


def object_store_stream(store: str) -> str:
    """The stream that holds an object store (JetStream's convention, ADR-20)."""
    return OBJ_STREAM_TEMPLATE.format(bucket=store)


async def provision(js: JetStreamContext, config: BusConfig) -> None:
    """Create or update the streams, the consumers and the bucket of `config`."""
    # Each step is idempotent, so a step that meets a cluster still forming (503: no meta leader yet, or too few
    # servers known for N replicas) or a reconnect is simply tried again.
    replicas = config.stream_replicas
    for stream in config.streams():
        await retrying(lambda: _ensure_stream(js, stream, replicas), f"provision stream {stream.name}")
    for consumer in config.consumers():
        await retrying(lambda: js.add_consumer(consumer.stream, consumer_config(consumer)),
                       f"provision consumer {consumer.durable}")
    for bucket in (config.bucket(), config.limits_bucket()):
        await retrying(lambda: _ensure_bucket(js, bucket, replicas), f"provision bucket {bucket.name}")
    for store in config.object_stores():
        await retrying(lambda: _ensure_object_store(js, store, replicas), f"provision object store {store.name}")
    log.info("provisioned streams %s, %d consumers, buckets %s, object stores %s, %d replica(s) each",
             [s.name for s in config.streams()], len(config.consumers()),
             [config.bucket().name, config.limits_bucket().name],
             [o.name for o in config.object_stores()], config.stream_replicas)


def stream_config(spec: StreamSpec, replicas: int = 1) -> api.StreamConfig:
    """The nats-py form of a StreamSpec."""
    return api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention],
        discard=_DISCARD[spec.discard],
        max_msgs=spec.max_msgs if spec.max_msgs is not None else -1,
        max_age=spec.max_age_s or 0,
        duplicate_window=spec.duplicate_window_s,
        storage=_STORAGE[spec.storage],
        num_replicas=replicas,
    )


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    """The nats-py form of a ConsumerSpec (durable, pull, explicit acks)."""
    return api.ConsumerConfig(
        durable_name=spec.durable,
        name=spec.durable,
        description=spec.description,
        filter_subject=spec.filter_subjects[0] if len(spec.filter_subjects) == 1 else None,
        filter_subjects=list(spec.filter_subjects) if len(spec.filter_subjects) > 1 else None,
        ack_policy=api.AckPolicy.EXPLICIT,
        deliver_policy=api.DeliverPolicy.ALL,
        max_deliver=spec.max_deliver,
        ack_wait=spec.ack_wait_s,
        max_ack_pending=spec.max_ack_pending,
    )


async def _ensure_stream(js: JetStreamContext, spec: StreamSpec, replicas: int) -> None:
    wanted = stream_config(spec, replicas)
    try:
        existing = (await js.stream_info(spec.name)).config
    except NotFoundError:
        await js.add_stream(wanted)
        log.info("created stream %s", spec.name)
        return
    for field in ("retention", "storage"):
        have, want = getattr(existing, field), getattr(wanted, field)
        if have != want:
            raise ProvisionConflict(f"stream {spec.name} has {field}={have!s}, the bus needs {want!s}; the server "
                                    f"cannot change it in place: delete the stream (its data goes) and provision again")
    await js.update_stream(wanted)


async def _ensure_bucket(js: JetStreamContext, spec: BucketSpec, replicas: int) -> None:
    try:
        await js.key_value(spec.name)
    except BucketNotFoundError:
        await js.create_key_value(api.KeyValueConfig(bucket=spec.name, description=spec.description,
                                                     history=spec.history, ttl=spec.ttl_s,
                                                     storage=_STORAGE[spec.storage], replicas=replicas))
        log.info("created bucket %s (%d replica(s))", spec.name, replicas)
        return
    # Exists: its limits are kept as an operator may have tuned them; only its replica count is brought in line.
    await _ensure_replicas(js, bucket_stream(spec.name), replicas)


async def _ensure_object_store(js: JetStreamContext, spec: ObjectStoreSpec, replicas: int) -> None:
    try:
        await js.object_store(spec.name)
    except BucketNotFoundError:
        await js.create_object_store(spec.name, api.ObjectStoreConfig(description=spec.description, ttl=spec.ttl_s,
                                                                      storage=_STORAGE[spec.storage],
                                                                      replicas=replicas))
        log.info("created object store %s (%d replica(s))", spec.name, replicas)
        return
    await _ensure_replicas(js, object_store_stream(spec.name), replicas)


async def _ensure_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Change an existing stream's replica count in place (nothing else of its configuration)."""
    config = (await js.stream_info(stream)).config
    if config.num_replicas == replicas:
        return
    log.info("stream %s: %s -> %d replica(s)", stream, config.num_replicas, replicas)
    config.num_replicas = replicas
    await js.update_stream(config)


async def open_bucket(js: JetStreamContext, name: str = "voxmesh") -> KeyValue:
    """Bind to the provisioned KV bucket, its reads answered by the stream's leader; NotProvisioned if it does not
    exist.

    Every read of this bucket decides something fencing rests on (`owner.<id>` before a claim or a takeover,
    `lease.<replica>` before judging a replica dead, `part.<n>` before claiming a partition), so it must see every
    write acknowledged before it. nats-py reads a bucket whose stream allows direct gets with `$JS.API.DIRECT.GET`,
    which any replica answers (on a cluster, most often the one the client is connected to, which may not have
    applied the latest write yet); this handle reads with `$JS.API.STREAM.MSG.GET` instead, which only the stream's
    leader answers, from the state it acknowledged writes from. Writes are compare-and-set on the leader either way.
    `provision` makes the bucket without direct gets (nats-py's default); this handle holds for one made by another
    tool that allows them (`nats kv add` does).
    """
    try:
        await retrying(lambda: js.key_value(name), f"open bucket {name}")  # that it exists, and is a bucket
    except BucketNotFoundError as exc:
        raise NotProvisioned(f"KV bucket {name!r} does not exist: run `voxmesh provision` or `voxmesh up`") from exc
    return KeyValue(name=name, stream=bucket_stream(name), pre=KV_PRE_TEMPLATE.format(bucket=name), js=js,
                    direct=False)
