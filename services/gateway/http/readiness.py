"""`/ready`: can this gateway serve a request now? NATS connected, the streams exist, at least one live decode
replica and at least one vocoder partition owner with a live lease."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js.errors import NotFoundError

from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from services.bus.leases import live_replicas
from services.gateway.requests.mesh_liveness import live_partition_owners
from services.gateway.requests.synthesis import Synthesizer


@dataclass(slots=True)
class Readiness:
    """The verdict and why.

    Attributes:
        ready: True when a request admitted now can be served.
        reasons: what is missing, for a person (empty when ready).
        decode_replicas: decode replicas with a live lease.
        vocoder_partitions: partition -> vocoder replica, for owners with a live lease.
    """

    ready: bool = False
    reasons: list[str] = field(default_factory=list)
    decode_replicas: list[str] = field(default_factory=list)
    vocoder_partitions: dict[int, str] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"ready": self.ready, "reasons": self.reasons, "decode_replicas": self.decode_replicas,
                "vocoder_partitions": {str(p): r for p, r in sorted(self.vocoder_partitions.items())}}


async def check_readiness(mesh: Synthesizer) -> Readiness:
    """Look at the bus now (a few reads; meant for probes, not for every request)."""
    verdict = Readiness()
    if not mesh.nc.is_connected:
        verdict.reasons.append("not connected to NATS")
        return verdict
    for stream in (REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM):
        try:
            await mesh.js.stream_info(stream)
        except NotFoundError:
            verdict.reasons.append(f"stream {stream} does not exist: run `voxmesh provision`")
    verdict.decode_replicas = await live_replicas(mesh.kv, "decode")
    if not verdict.decode_replicas:
        verdict.reasons.append("no decode replica holds a live lease")
    verdict.vocoder_partitions = await live_partition_owners(mesh.kv)
    if not verdict.vocoder_partitions:
        verdict.reasons.append("no vocoder partition has an owner with a live lease")
    verdict.ready = not verdict.reasons
    return verdict
