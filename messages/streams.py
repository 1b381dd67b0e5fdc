"""Streams, consumers, the KV bucket and the object stores of voxmesh, as plain specifications.

`services.bus.provision` turns these into server objects in one administrative step; services only bind to them.
Audio travels on core NATS and has no stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from messages import subjects
from messages.errors import InvalidConfig
from messages.key_limits import LIMITS_BUCKET
from messages.voice_clone import REF_AUDIO_STORE, VOICES_STORE

REQUESTS_STREAM = "REQUESTS"
EVENTS_STREAM = "EVENTS"
CODES_STREAM = "CODES"
USAGE_STREAM = "USAGE"
USAGE_CONSUMER = "usage"
"""The durable consumer of EVENTS' terminal events shared by every gateway: each terminal becomes one usage record."""
BUCKET = "voxmesh"

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
MAX_REPLICAS = 5  # JetStream replicates a stream on at most 5 servers


def requests_consumer(model: str) -> str:
    """The durable pull consumer of one model's requests, shared by that model's decode replicas."""
    return f"decode-{subjects.slug(model)}"


def lane_consumer(model: str, priority: str, lane: int) -> str:
    """The durable pull consumer of one priority lane of a model's requests, shared by that model's decode replicas."""
    subjects.request_lane(model, priority, lane)  # validates
    return f"decode-{subjects.slug(model)}-{priority}-{lane}"


def consumer_for(model: str, priority: str, tenant: str) -> str:
    """The lane consumer that holds a request of `tenant` at `priority` (`subjects.request_for`'s subject)."""
    return lane_consumer(model, priority, subjects.tenant_lane(tenant))


@dataclass(frozen=True, slots=True)
class RequestLane:
    """One queue decode takes a model's requests from: a consumer of REQUESTS and the subjects it holds."""

    priority: str
    durable: str
    subjects: tuple[str, ...]


def request_lanes(model: str) -> list[RequestLane]:
    """Every queue of a model's decode work, in the order decode prefers them: the direct queue (hand-offs from
    prefill, requests from before priorities; interactive), then each priority's tenant lanes."""
    lanes = [RequestLane("interactive", requests_consumer(model),
                         (subjects.request(model), subjects.handoff_queue(model)))]
    lanes += [RequestLane(priority, lane_consumer(model, priority, lane),
                          (subjects.request_lane(model, priority, lane),))
              for priority in subjects.PRIORITIES for lane in range(subjects.TENANT_LANES)]
    return lanes


def prefill_consumer(model: str) -> str:
    """The durable pull consumer of one model's requests routed to remote prefill, shared by its prefill replicas."""
    return f"prefill-{subjects.slug(model)}"


def codes_consumer(partition: int) -> str:
    """The durable pull consumer of one vocoder partition's codes."""
    if partition < 0:
        raise InvalidConfig(f"partition must be >= 0, got {partition}")
    return f"vocoder-p{partition}"


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One JetStream stream."""

    name: str
    subjects: tuple[str, ...]
    retention: Literal["workqueue", "limits"]
    discard: Literal["old", "new"]
    max_msgs: int | None  # None: unbounded
    max_age_s: float | None  # None: kept until limits or deletion
    duplicate_window_s: float  # Nats-Msg-Id dedup window
    storage: Literal["file", "memory"]
    description: str


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """One durable pull consumer with explicit acks."""

    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    max_deliver: int
    ack_wait_s: float
    max_ack_pending: int
    description: str


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """The JetStream KV bucket for ownership, leases, partitions and cancellation."""

    name: str
    history: int
    ttl_s: float | None
    storage: Literal["file", "memory"]
    description: str


@dataclass(frozen=True, slots=True)
class ObjectStoreSpec:
    """A JetStream object store (large values: reference audio, saved voices)."""

    name: str
    ttl_s: float | None  # None: kept until deleted
    storage: Literal["file", "memory"]
    description: str


@dataclass(frozen=True, slots=True)
class BusConfig:
    """Every setting of the bus that provisioning needs. Defaults follow DESIGN.md."""

    models: tuple[str, ...] = ("tiny",)  # one REQUESTS consumer per model
    num_partitions: int = 4  # vocoder partitions of CODES
    max_queued_requests: int = 256  # REQUESTS bound; a full queue refuses new requests (429)
    request_max_deliver: int = 3  # deliveries before a request is poison
    # Decode acks right after claiming ownership, so this can be short; it must be well below the gateway's queue
    # deadline (30 s): a request delivered to a replica that died that instant (its host lost, its last pull still
    # open) is delivered again only after it, and must still reach a live replica in time.
    request_ack_wait_s: float = 10.0
    events_max_age_s: float = 24 * HOUR_S  # longer than any request lives
    codes_max_age_s: float = 2 * HOUR_S  # request lifetime + resume window
    duplicate_window_s: float = 120.0
    codes_ack_wait_s: float = 30.0
    codes_max_ack_pending: int = 4096
    bucket_ttl_s: float = 24 * HOUR_S  # owner/cancel records outlive any request, then go
    limits_ttl_s: float = 48 * HOUR_S  # a key's limit state outlives its UTC day's audio total, then goes
    usage_max_age_s: float = 35 * DAY_S  # a month of usage records, and a few days to read the month's last ones
    usage_ack_wait_s: float = 30.0  # a gateway that took a terminal and died: another records it after this
    usage_max_ack_pending: int = 1024
    ref_audio_ttl_s: float = HOUR_S  # a reference outlives its requests; a gateway stores it again when reused
    storage: Literal["file", "memory"] = "file"
    stream_replicas: int = 1  # copies of every stream, the bucket and the object stores (a RAFT group of N servers)

    def __post_init__(self) -> None:
        if not self.models:
            raise InvalidConfig("BusConfig.models is empty: name at least one model")
        slugs = [subjects.slug(model) for model in self.models]
        if len(set(slugs)) != len(slugs):
            raise InvalidConfig(f"BusConfig.models {self.models!r} name one model twice (after slugging)")
        _require(self.num_partitions >= 1, "num_partitions", self.num_partitions, ">= 1")
        _require(self.max_queued_requests >= 1, "max_queued_requests", self.max_queued_requests, ">= 1")
        _require(self.request_max_deliver >= 1, "request_max_deliver", self.request_max_deliver, ">= 1")
        for name in ("request_ack_wait_s", "events_max_age_s", "codes_max_age_s", "duplicate_window_s",
                     "codes_ack_wait_s", "bucket_ttl_s", "ref_audio_ttl_s", "limits_ttl_s", "usage_max_age_s",
                     "usage_ack_wait_s"):
            _require(getattr(self, name) > 0, name, getattr(self, name), "> 0")
        _require(self.duplicate_window_s <= self.codes_max_age_s, "duplicate_window_s", self.duplicate_window_s,
                 "<= codes_max_age_s")
        _require(self.usage_max_age_s >= self.events_max_age_s, "usage_max_age_s", self.usage_max_age_s,
                 ">= events_max_age_s (a record must outlive the terminal event it counts)")
        _require(self.usage_max_ack_pending >= 1, "usage_max_ack_pending", self.usage_max_ack_pending, ">= 1")
        _require(self.storage in ("file", "memory"), "storage", self.storage, "'file' or 'memory'")
        _require(1 <= self.stream_replicas <= MAX_REPLICAS, "stream_replicas", self.stream_replicas,
                 f"between 1 and {MAX_REPLICAS} (JetStream's limit)")

    def streams(self) -> list[StreamSpec]:
        """REQUESTS (work queue, bounded, discard new), EVENTS, CODES and USAGE (limits)."""
        return [
            StreamSpec(REQUESTS_STREAM, (subjects.all_requests(),), "workqueue", "new", self.max_queued_requests,
                       None, self.duplicate_window_s, self.storage, "synthesis requests awaiting a decode replica"),
            StreamSpec(EVENTS_STREAM, (subjects.all_events(),), "limits", "old", None, self.events_max_age_s,
                       self.duplicate_window_s, self.storage, "request lifecycle events and terminal events"),
            StreamSpec(CODES_STREAM, (subjects.all_codes(),), "limits", "old", None, self.codes_max_age_s,
                       self.duplicate_window_s, self.storage, "codec frames per request, by vocoder partition"),
            StreamSpec(USAGE_STREAM, (subjects.all_usage(),), "limits", "old", None, self.usage_max_age_s,
                       self.duplicate_window_s, self.storage, "one usage record per ended request (tenant, model, "
                       "characters, audio seconds, outcome)"),
        ]

    def consumers(self) -> list[ConsumerSpec]:
        """Per model: the REQUESTS consumers of decode (its direct queue and its priority lanes) and of prefill; one
        CODES consumer per vocoder partition; the gateways' consumer of terminal events (usage)."""
        # Decode's queues: the direct one (hand-offs, requests from before priorities) and one per priority lane;
        # a replica pulls from them only as far as it has room, so its room is never promised twice.
        found = [
            ConsumerSpec(REQUESTS_STREAM, lane.durable, lane.subjects, self.request_max_deliver,
                         self.request_ack_wait_s, self.max_queued_requests,
                         f"decode replicas of {m}: {lane.priority} requests ({', '.join(lane.subjects)})")
            for m in self.models for lane in request_lanes(m)
        ]
        found += [
            ConsumerSpec(REQUESTS_STREAM, prefill_consumer(m), (subjects.prefill_request(m),), self.request_max_deliver,
                         self.request_ack_wait_s, self.max_queued_requests, f"prefill replicas of {m}")
            for m in self.models
        ]
        found += [
            ConsumerSpec(CODES_STREAM, codes_consumer(p), (subjects.codes_of_partition(p),), -1, self.codes_ack_wait_s,
                         self.codes_max_ack_pending, f"vocoder owning partition {p}")
            for p in range(self.num_partitions)
        ]
        # Unbounded deliveries: a terminal is retried until its record is stored (a record is never given up on).
        found.append(ConsumerSpec(EVENTS_STREAM, USAGE_CONSUMER, (subjects.all_terminals(),), -1,
                                  self.usage_ack_wait_s, self.usage_max_ack_pending,
                                  "gateways: one usage record per terminal event"))
        return found

    def bucket(self) -> BucketSpec:
        """The `voxmesh` KV bucket (keys: owner., cancel., lease., part.)."""
        return BucketSpec(BUCKET, 1, self.bucket_ttl_s, self.storage, "ownership, leases, partitions, cancellation")

    def limits_bucket(self) -> BucketSpec:
        """The `voxmesh-limits` KV bucket (messages/key_limits.py): the keys' limits, shared by every gateway."""
        return BucketSpec(LIMITS_BUCKET, 1, self.limits_ttl_s, self.storage,
                          "per-key rate, live-request and daily audio limits shared by the gateways")

    def object_stores(self) -> list[ObjectStoreSpec]:
        """Reference audio of requests (expiring) and saved voices (kept)."""
        return [
            ObjectStoreSpec(REF_AUDIO_STORE, self.ref_audio_ttl_s, self.storage,
                            "reference audio of voice-cloning requests, keyed by content"),
            ObjectStoreSpec(VOICES_STORE, None, self.storage, "saved voices: computed voice prompts by model and name"),
        ]


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise InvalidConfig(f"BusConfig.{name} must be {rule}, got {value!r}")
