"""Which NATS subjects each voxmesh user may publish and subscribe to: least privilege, one user per service.

The server enforces these lists (`services.bus.nats_auth` writes them into its configuration). The rules they make
true: the gateway never publishes codes or audio; decode never publishes requests or audio (it hears them published,
as the doorbell of its request lanes); the vocoder never
publishes requests or codes; prefill publishes requests only onto decode's queue (prefilled, or left to decode),
never codes, audio or events; only prefill answers on a KV transfer subject (decode asks there, and may not
subscribe: it cannot pose as the replica holding an offer); an mtp replica publishes only its lease (and its
replies); only `provision` creates, changes or deletes streams and the KV bucket; `observer` only reads (events,
`$SRV` discovery, stream and KV listings), and never a request's text; only the gateway records usage (it turns
terminal events into USAGE records and serves them to operators), and no other service reads USAGE.
Replies to requests a user received (micro endpoints, `$SRV` pings) are allowed by `allow_responses`, so no user
needs to publish on `_INBOX.>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from messages import subjects
from messages.key_limits import LIMITS_BUCKET
from messages.streams import BUCKET, CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM, USAGE_STREAM
from messages.voice_clone import REF_AUDIO_STORE, VOICES_STORE

JS_API = "$JS.API"
INBOX = "_INBOX.>"
KV_STREAM = f"KV_{BUCKET}"
LIMITS_KV_STREAM = f"KV_{LIMITS_BUCKET}"


@dataclass(frozen=True, slots=True)
class Permissions:
    """A user's subject lists, in the server's terms (a deny wins over an allow)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    allow_responses: bool = True  # may answer the requests it received (micro endpoints, `$SRV` pings)


def _kv(key_pattern: str) -> str:
    """The subject a KV put of keys matching `key_pattern` is published on."""
    return f"$KV.{BUCKET}.{key_pattern}"




def _limits() -> str:
    """Every key of the limits bucket: the gateway's alone (a key's rate, seats and daily audio)."""
    return f"$KV.{LIMITS_BUCKET}.>"


def _objects(store: str) -> str:
    """Every subject of an object store's chunks and metadata (`$O.<store>.C.*`, `$O.<store>.M.*`)."""
    return f"$O.{store}.>"


# Stream and bucket administration: what only `provision` may do (a KV bucket is the stream KV_<bucket>). The
# object stores' own streams may be purged by their users: replacing or deleting an object purges its old chunks.
STREAM_ADMIN = (f"{JS_API}.STREAM.CREATE.>", f"{JS_API}.STREAM.UPDATE.>", f"{JS_API}.STREAM.DELETE.>",
                *(f"{JS_API}.STREAM.PURGE.{name}" for name in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM,
                                                                 USAGE_STREAM, KV_STREAM, LIMITS_KV_STREAM)),
                *(f"{JS_API}.STREAM.MSG.DELETE.{name}" for name in (EVENTS_STREAM, CODES_STREAM, USAGE_STREAM,
                                                                      KV_STREAM, LIMITS_KV_STREAM)),
                f"{JS_API}.STREAM.RESTORE.>", f"{JS_API}.CONSUMER.DELETE.>", f"{JS_API}.CONSUMER.DURABLE.CREATE.>")
# Taking one request off the queue: the gateway's supervisor frees the slot of a request that ended before decode
# took it (cancelled, past its deadline); no other service may drop a request.
DROP_REQUEST = f"{JS_API}.STREAM.MSG.DELETE.{REQUESTS_STREAM}"

# What every service needs of JetStream: the API (less the administration above), acks, flow control, discovery.
ADVISORIES = "$JS.EVENT.ADVISORY.>"  # JetStream's own notes (max deliveries, terms): ids and counts, no texts
_SERVICE_BASE_PUBLISH = (f"{JS_API}.>", "$JS.ACK.>", "$JS.FC.>", "$SRV.>")
_SERVICE_BASE_SUBSCRIBE = (INBOX, "$SRV.>")


# Reading USAGE (tenants and what each consumed): the gateway's, for its operator route; no other service's.
USAGE_READS = (f"{JS_API}.CONSUMER.CREATE.{USAGE_STREAM}", f"{JS_API}.CONSUMER.CREATE.{USAGE_STREAM}.>",
               f"{JS_API}.STREAM.MSG.GET.{USAGE_STREAM}", f"{JS_API}.DIRECT.GET.{USAGE_STREAM}",
               f"{JS_API}.DIRECT.GET.{USAGE_STREAM}.>")


def _service(publish: tuple[str, ...], subscribe: tuple[str, ...], deny: tuple[str, ...]) -> Permissions:
    return Permissions(publish=_SERVICE_BASE_PUBLISH + publish, subscribe=_SERVICE_BASE_SUBSCRIBE + subscribe,
                       publish_deny=STREAM_ADMIN + deny)


def _every(root: str) -> str:
    return f"{root}.>"


GATEWAY = _service(
    publish=(_every(subjects.REQUESTS_ROOT), _every(subjects.EVENTS_ROOT), _every(subjects.REDECODE_ROOT),
             _kv(subjects.all_cancel_keys()), _kv(subjects.all_lease_keys()), _every(subjects.VOICE_ROOT),
             _objects(REF_AUDIO_STORE), _objects(VOICES_STORE), _limits(), _every(subjects.USAGE_ROOT)),
    subscribe=(_every(subjects.AUDIO_ROOT), ADVISORIES),
    deny=(_every(subjects.CODES_ROOT), _every(subjects.AUDIO_ROOT)))

# decode asks the mtp replicas for code-predictor steps (the `mtp` topology), on each replica's own subject.
_DECODE_PUBLISH = (_every(subjects.CODES_ROOT), _every(subjects.EVENTS_ROOT), _kv("owner.*"),
                   _kv(subjects.all_lease_keys()), _objects(VOICES_STORE), _every(subjects.KV_TRANSFER_ROOT),
                   subjects.all_mtp_steps())
# decode hears every request published (the doorbell of its lanes, services.bus.laned_pull): it reads them anyway.
_DECODE_SUBSCRIBE = (f"{subjects.ADMIN_ROOT}.decode.>", _every(subjects.VOICE_ROOT), ADVISORIES,
                     f"{subjects.REQUESTS_ROOT}.*", _every(subjects.REQUESTS_ROOT))
DECODE = _service(_DECODE_PUBLISH, _DECODE_SUBSCRIBE,
                  deny=(_every(subjects.REQUESTS_ROOT), _every(subjects.AUDIO_ROOT), DROP_REQUEST, *USAGE_READS))

_VOCODER_PUBLISH = (_every(subjects.AUDIO_ROOT), _every(subjects.EVENTS_ROOT), _kv(subjects.all_partition_keys()),
                    _kv(subjects.all_lease_keys()))
_VOCODER_SUBSCRIBE = (_every(subjects.REDECODE_ROOT), f"{subjects.ADMIN_ROOT}.vocoder.>", ADVISORIES)
VOCODER = _service(_VOCODER_PUBLISH, _VOCODER_SUBSCRIBE,
                   deny=(_every(subjects.REQUESTS_ROOT), _every(subjects.CODES_ROOT), DROP_REQUEST, *USAGE_READS))

# prefill: puts prefilled requests (and those it leaves to decode) on decode's queue, and answers decode's requests
# for the KV it offers (services.transfer); never codes, audio or events, never a request onto the prefill queue.
PREFILL = _service(
    publish=(f"{subjects.REQUESTS_ROOT}.*", f"{subjects.REQUESTS_ROOT}.*.handoff", _kv(subjects.all_lease_keys())),
    subscribe=(_every(subjects.KV_TRANSFER_ROOT), f"{subjects.ADMIN_ROOT}.prefill.>", ADVISORIES),
    deny=(f"{subjects.REQUESTS_ROOT}.*.prefill", _every(subjects.CODES_ROOT), _every(subjects.AUDIO_ROOT),
          _every(subjects.EVENTS_ROOT), DROP_REQUEST, *USAGE_READS))

# decode and vocoder in one process (`voxmesh serve colocated`): their union, still never requests.
COLOCATED = _service(_DECODE_PUBLISH + _VOCODER_PUBLISH, _DECODE_SUBSCRIBE + _VOCODER_SUBSCRIBE,
                     deny=(_every(subjects.REQUESTS_ROOT), DROP_REQUEST, *USAGE_READS))

# A code-predictor replica answers steps on its own subject and keeps its lease; it publishes nothing else.
MTP = _service(publish=(_kv(subjects.all_lease_keys()),), subscribe=(subjects.all_mtp_steps(),),
               deny=(_every(subjects.REQUESTS_ROOT), _every(subjects.CODES_ROOT), _every(subjects.AUDIO_ROOT),
                     _every(subjects.EVENTS_ROOT), DROP_REQUEST, *USAGE_READS))

PROVISION = Permissions(publish=(f"{JS_API}.>",), subscribe=(INBOX,), allow_responses=False)

# Read-only: stream, consumer and KV listings, events (tailed through an ephemeral consumer of EVENTS), `$SRV`
# discovery. Reading a stored message is allowed on EVENTS and the bucket only: REQUESTS holds request texts.
OBSERVER = Permissions(
    publish=(f"{JS_API}.INFO", f"{JS_API}.STREAM.INFO.*", f"{JS_API}.STREAM.NAMES", f"{JS_API}.STREAM.LIST",
             f"{JS_API}.CONSUMER.INFO.*.*", f"{JS_API}.CONSUMER.NAMES.*", f"{JS_API}.CONSUMER.LIST.*",
             f"{JS_API}.CONSUMER.CREATE.{EVENTS_STREAM}", f"{JS_API}.CONSUMER.CREATE.{EVENTS_STREAM}.>",
             f"{JS_API}.CONSUMER.CREATE.{KV_STREAM}", f"{JS_API}.CONSUMER.CREATE.{KV_STREAM}.>",
             f"{JS_API}.STREAM.MSG.GET.{EVENTS_STREAM}", f"{JS_API}.STREAM.MSG.GET.{KV_STREAM}",
             f"{JS_API}.DIRECT.GET.{EVENTS_STREAM}", f"{JS_API}.DIRECT.GET.{EVENTS_STREAM}.>",
             f"{JS_API}.DIRECT.GET.{KV_STREAM}", f"{JS_API}.DIRECT.GET.{KV_STREAM}.>",
             "$JS.FC.>", "$SRV.>"),
    subscribe=(INBOX, _every(subjects.EVENTS_ROOT)), allow_responses=False)

# User name -> permissions; `operator` (no entry) has every permission: the person running the mesh.
SERVICE_USERS: dict[str, Permissions] = {
    "gateway": GATEWAY, "decode": DECODE, "vocoder": VOCODER, "colocated": COLOCATED, "prefill": PREFILL,
    "mtp": MTP, "provision": PROVISION, "observer": OBSERVER,
}
OPERATOR_USER = "operator"
