"""One administrative step that creates (or brings up to date) every stream, consumer, the KV bucket and the object
stores.

Idempotent: running it again on a provisioned server changes nothing. Services never call it; they bind with
`open_bucket`/`PullConsumer.bind` and get NotProvisioned when something is missing.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from messages.streams import BucketSpec, BusConfig, ConsumerSpec, ObjectStoreSpec, StreamSpec
from services.bus.errors import NotProvisioned, ProvisionConflict

log = logging.getLogger(__name__)

_RETENTION = {"workqueue": api.RetentionPolicy.WORK_QUEUE, "limits": api.RetentionPolicy.LIMITS}
_DISCARD = {"old": api.DiscardPolicy.OLD, "new": api.DiscardPolicy.NEW}
_STORAGE = {"file": api.StorageType.FILE, "memory": api.StorageType.MEMORY}


async def provision(js: JetStreamContext, config: BusConfig) -> None:
    """Create or update the streams, the consumers and the bucket of `config`."""
    for stream in config.streams():
        await _ensure_stream(js, stream)
    for consumer in config.consumers():
        await js.add_consumer(consumer.stream, consumer_config(consumer))
    await _ensure_bucket(js, config.bucket())
    for store in config.object_stores():
        await _ensure_object_store(js, store)
    log.info("provisioned streams %s, %d consumers, bucket %s, object stores %s", [s.name for s in config.streams()],
             len(config.consumers()), config.bucket().name, [o.name for o in config.object_stores()])


def stream_config(spec: StreamSpec) -> api.StreamConfig:
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
        num_replicas=1,
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


async def _ensure_stream(js: JetStreamContext, spec: StreamSpec) -> None:
    wanted = stream_config(spec)
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


async def _ensure_bucket(js: JetStreamContext, spec: BucketSpec) -> None:
    try:
        await js.key_value(spec.name)
        return  # exists; its settings are only limits, kept as an operator may have tuned them
    except BucketNotFoundError:
        pass
    await js.create_key_value(api.KeyValueConfig(bucket=spec.name, description=spec.description,
                                                 history=spec.history, ttl=spec.ttl_s,
                                                 storage=_STORAGE[spec.storage]))
    log.info("created bucket %s", spec.name)


async def _ensure_object_store(js: JetStreamContext, spec: ObjectStoreSpec) -> None:
    try:
        await js.object_store(spec.name)
        return  # exists; kept as it is, like the KV bucket
    except BucketNotFoundError:
        pass
    await js.create_object_store(spec.name, api.ObjectStoreConfig(description=spec.description, ttl=spec.ttl_s,
                                                                  storage=_STORAGE[spec.storage]))
    log.info("created object store %s", spec.name)


async def open_bucket(js: JetStreamContext, name: str = "voxmesh") -> KeyValue:
    """Bind to the provisioned KV bucket; NotProvisioned if it does not exist."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError as exc:
        raise NotProvisioned(f"KV bucket {name!r} does not exist: run `voxmesh provision` or `voxmesh up`") from exc
