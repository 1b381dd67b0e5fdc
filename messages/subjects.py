"""Every NATS subject and KV key of voxmesh. No other module spells a subject.

Tokens that come from data (model names, request ids, replica names) never contain dots or wildcards: model names
are slugged with `slug()`, ids and replica names are validated with `token()`.
"""

from __future__ import annotations

import re
import zlib

from messages.errors import InvalidToken

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_SLUG_DROP = re.compile(r"[^a-z0-9_-]+")

# Roots, exposed for watchers and permission lists.
REQUESTS_ROOT = "tts.req"
EVENTS_ROOT = "tts.events"
CODES_ROOT = "tts.codes"
AUDIO_ROOT = "tts.audio"
REDECODE_ROOT = "tts.redecode"
MTP_ROOT = "tts.mtp"
ADMIN_ROOT = "tts.admin"
VOICE_ROOT = "tts.voice"
KV_TRANSFER_ROOT = "tts.kvxfer"
USAGE_ROOT = "tts.usage"

TERMINAL_KIND = "terminal"


def slug(name: str) -> str:
    """A model name as one subject token: lower case, '.' -> '_', '/' and other separators -> '-'.

    `slug("Qwen3-TTS-0.6B") == "qwen3-tts-0_6b"`; `slug("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    == "qwen-qwen3-tts-12hz-0_6b-customvoice"`.
    """
    lowered = name.strip().lower().replace(".", "_")
    result = _SLUG_DROP.sub("-", lowered).strip("-")
    if not result:
        raise InvalidToken(f"model name {name!r} has no characters usable in a subject")
    return token(result)


def same_model(asked: str, served: str) -> bool:
    """Whether the model a request names (`asked`) is the `served` one: the same name, or the same subject token
    after slugging (so "Qwen3-TTS-0.6B" asks for "qwen3-tts-0_6b"); a name with no usable character is no model."""
    if asked == served:
        return True
    try:
        return slug(asked) == slug(served)
    except InvalidToken:
        return False


def token(value: str) -> str:
    """Return `value` if it is a safe subject token ([A-Za-z0-9_-], 1..128 chars), else raise InvalidToken."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise InvalidToken(f"{value!r} is not a valid subject token: use 1-128 of [A-Za-z0-9_-]")
    return value


def partition_for(request_id: str, num_partitions: int) -> int:
    """The vocoder partition of a request: a stable hash, the same in every process and run."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return zlib.crc32(token(request_id).encode()) % num_partitions


def _partition(partition: int) -> str:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidToken(f"partition must be an int >= 0, got {partition!r}")
    return str(partition)


# --- REQUESTS --------------------------------------------------------------------------------------------------
def request(model: str) -> str:
    """A model's direct decode queue (stream REQUESTS): requests that were published before priorities existed, and
    those a prefill replica leaves to decode. New requests go to their lane (`request_lane`)."""
    return f"{REQUESTS_ROOT}.{slug(model)}"


PRIORITIES = ("interactive", "batch")
"""The request priorities, in the order decode serves them (`SynthesisRequest.priority`)."""
TENANT_LANES = 8
"""Lanes per priority. A tenant's requests all go to one lane (`tenant_lane`), and decode takes from the lanes with
work in turn, so two tenants in different lanes share decode's seats evenly whatever their backlogs; two tenants in
one lane (a chance of 1 in TENANT_LANES) share it first-come-first-served. Part of the contract: the gateway and the
provisioned consumers must agree on it."""


def tenant_lane(tenant: str) -> int:
    """The lane of a tenant's requests: a stable hash of its name, the same in every process and run."""
    return zlib.crc32(tenant.encode()) % TENANT_LANES


def _priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise InvalidToken(f"priority must be one of {PRIORITIES}, got {priority!r}")
    return priority


def request_lane(model: str, priority: str, lane: int) -> str:
    """Where the gateway publishes a model's requests of one priority and tenant lane (stream REQUESTS):
    `tts.req.<model>.<priority>.<lane>`; each lane has its own decode consumer (`streams.lane_consumer`)."""
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < TENANT_LANES:
        raise InvalidToken(f"lane must be an int in [0, {TENANT_LANES}), got {lane!r}")
    return f"{REQUESTS_ROOT}.{slug(model)}.{_priority(priority)}.{lane}"


def request_for(model: str, priority: str, tenant: str) -> str:
    """The lane subject a request of `tenant` at `priority` is published on."""
    return request_lane(model, priority, tenant_lane(tenant))


def requests_of_model(model: str) -> str:
    """Wildcard over every request subject of one model but the direct queue itself (lanes, prefill, hand-offs):
    what decode watches to learn that work arrived."""
    return f"{REQUESTS_ROOT}.{slug(model)}.>"


def prefill_request(model: str) -> str:
    """Where the gateway publishes a model's requests for a prefill replica (stream REQUESTS): long prompts, while a
    prefill replica is waiting for work."""
    return f"{REQUESTS_ROOT}.{slug(model)}.prefill"


def handoff_queue(model: str) -> str:
    """Where prefill replicas put prefilled requests (stream REQUESTS); decode replicas pull them when they have
    room, then fetch the prompt's KV from the prefill replica by UCX."""
    return f"{REQUESTS_ROOT}.{slug(model)}.handoff"


def all_requests() -> str:
    """Wildcard over every model's requests (the REQUESTS stream's subjects)."""
    return f"{REQUESTS_ROOT}.>"


# --- EVENTS ----------------------------------------------------------------------------------------------------
def event(request_id: str, kind: str) -> str:
    """A lifecycle event of one request (stream EVENTS); `kind` is the event type's KIND."""
    return f"{EVENTS_ROOT}.{token(request_id)}.{token(kind)}"


def terminal(request_id: str) -> str:
    """The one terminal event of a request; guarded by `Nats-Expected-Last-Subject-Sequence: 0`."""
    return event(request_id, TERMINAL_KIND)


def events_of(request_id: str) -> str:
    """Wildcard over every event of one request."""
    return f"{EVENTS_ROOT}.{token(request_id)}.*"


def events_of_kind(kind: str) -> str:
    """Wildcard over one kind of event of every request (e.g. each `accepted`: the request is on REQUESTS)."""
    return f"{EVENTS_ROOT}.*.{token(kind)}"


def all_events() -> str:
    """Wildcard over every event (the EVENTS stream's subjects; what `voxmesh events` tails)."""
    return f"{EVENTS_ROOT}.>"


def all_terminals() -> str:
    """Wildcard over every request's terminal event."""
    return f"{EVENTS_ROOT}.*.{TERMINAL_KIND}"


# --- USAGE -----------------------------------------------------------------------------------------------------
def usage(request_id: str) -> str:
    """The one usage record of a request (stream USAGE); guarded by `Nats-Expected-Last-Subject-Sequence: 0`."""
    return f"{USAGE_ROOT}.{token(request_id)}"


def all_usage() -> str:
    """Wildcard over every usage record (the USAGE stream's subjects)."""
    return f"{USAGE_ROOT}.>"


# --- CODES -----------------------------------------------------------------------------------------------------
def codes(partition: int, request_id: str) -> str:
    """The codes of one request (stream CODES), in its vocoder partition."""
    return f"{CODES_ROOT}.{_partition(partition)}.{token(request_id)}"


def codes_of_partition(partition: int) -> str:
    """Wildcard over every request's codes in one partition (what that partition's vocoder consumes)."""
    return f"{CODES_ROOT}.{_partition(partition)}.*"


def all_codes() -> str:
    """Wildcard over all codes (the CODES stream's subjects)."""
    return f"{CODES_ROOT}.>"


# --- audio and control (core NATS) -----------------------------------------------------------------------------
def audio(request_id: str) -> str:
    """PCM chunks of one request, core NATS (not stored)."""
    return f"{AUDIO_ROOT}.{token(request_id)}"


def redecode(partition: int) -> str:
    """Core NATS request to a partition's vocoder: re-decode a request from CODES starting at a chunk sequence."""
    return f"{REDECODE_ROOT}.{_partition(partition)}"


def mtp_step(replica: str) -> str:
    """Core NATS request/reply to one code-predictor (mtp) replica: each replica listens on its own subject, so the
    caller picks the least-loaded one (found by its lease) instead of a queue group picking at random."""
    return f"{MTP_ROOT}.{token(replica)}.step"


def all_mtp_steps() -> str:
    """Wildcard over every mtp replica's step subject."""
    return f"{MTP_ROOT}.*.step"


def mtp_reply(inbox: str, step_id: int, attempt: int) -> str:
    """Where one attempt of a step is answered: under the client's own inbox (`nc.new_inbox()`), so each attempt's
    reply, or the server's no-responders notice for it, says which attempt it answers."""
    return f"{inbox}.{int(step_id)}.{int(attempt)}"


def mtp_replies(inbox: str) -> str:
    """Wildcard over every `mtp_reply` under a client's inbox."""
    return f"{inbox}.*.*"


def mtp_reply_address(subject: str) -> tuple[int, int] | None:
    """(step_id, attempt) of an `mtp_reply` subject; None when it is not one."""
    parts = subject.rsplit(".", 2)
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[1]), int(parts[2])


def voice_create(model: str) -> str:
    """Core NATS request/reply to a model's decode replicas (queue group): compute and save a voice."""
    return f"{VOICE_ROOT}.{slug(model)}.create"


def kv_transfer(replica: str) -> str:
    """Core NATS request to the replica that offered KV (prefill): send the offered tensor to the asking worker."""
    return f"{KV_TRANSFER_ROOT}.{token(replica)}"


def admin(service: str, replica: str, verb: str) -> str:
    """Core NATS request to one replica's operator endpoint (e.g. decode's `drain`, vocoder's `status`)."""
    return f"{ADMIN_ROOT}.{token(service)}.{token(replica)}.{token(verb)}"


def max_deliveries_advisory(stream: str, consumer: str) -> str:
    """JetStream's advisory when a message of `consumer` on `stream` exhausted MaxDeliver."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"


def consumer_next(stream: str, consumer: str) -> str:
    """JetStream's API subject that hands out a pull consumer's next messages (the default API prefix, no domain)."""
    return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def stream_leader_stepdown(stream: str) -> str:
    """JetStream's API subject asking a stream's leader to step down (a request may name the member preferred next)."""
    return f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"


def consumer_leader_stepdown(stream: str, consumer: str) -> str:
    """JetStream's API subject asking a consumer's leader to step down (a request may name the member preferred)."""
    return f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"


def delivery_ack_prefix() -> str:
    """How the reply subject of every message JetStream delivers to a consumer begins (`$JS.ACK.<stream>.<consumer>
    ...`): what tells a delivery from a publish to observers of the whole subject space."""
    return "$JS.ACK."


def terminated_advisory(stream: str, consumer: str) -> str:
    """JetStream's advisory when a message of `consumer` on `stream` was termed (carries the term reason)."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.{consumer}"


# --- keys of the `voxmesh` KV bucket ---------------------------------------------------------------------------
def owner_key(request_id: str) -> str:
    """Decode ownership of a request: an OwnerRecord (replica, epoch), written by compare-and-set."""
    return f"owner.{token(request_id)}"


def cancel_key(request_id: str) -> str:
    """A CancelRecord, written by the gateway."""
    return f"cancel.{token(request_id)}"


def lease_key(replica: str) -> str:
    """A replica's Lease, renewed each second."""
    return f"lease.{token(replica)}"


def partition_key(partition: int) -> str:
    """A PartitionOwner: which vocoder replica owns partition n."""
    return f"part.{_partition(partition)}"


def all_cancel_keys() -> str:
    """Wildcard over every CancelRecord key (what decode watches)."""
    return "cancel.*"


def all_lease_keys() -> str:
    """Wildcard over every replica's Lease key."""
    return "lease.*"


def all_partition_keys() -> str:
    """Wildcard over every PartitionOwner key."""
    return "part.*"


# --- NATS micro discovery (nats-py's `micro` answers these for every service) -----------------------------------
def micro_ping(service: str | None = None) -> str:
    """`$SRV.PING` (every service answers) or `$SRV.PING.<service>` (that service's replicas answer)."""
    return "$SRV.PING" if service is None else f"$SRV.PING.{token(service)}"


def micro_ping_instance(service: str, instance_id: str) -> str:
    """`$SRV.PING.<service>.<id>`: only that one instance answers (a container's healthcheck asks its own)."""
    return f"$SRV.PING.{token(service)}.{token(instance_id)}"


def micro_info(service: str | None = None) -> str:
    """`$SRV.INFO` (every service answers: `nats micro ls`) or `$SRV.INFO.<service>` (its replicas answer)."""
    return "$SRV.INFO" if service is None else f"$SRV.INFO.{token(service)}"


def micro_stats(service: str | None = None) -> str:
    """`$SRV.STATS` (every service answers) or `$SRV.STATS.<service>`: each replica of `service` answers with its
    endpoints' counters and data (`nats micro stats <service>`)."""
    return "$SRV.STATS" if service is None else f"$SRV.STATS.{token(service)}"
