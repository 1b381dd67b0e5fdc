"""The gateway's metrics per key class (the keys file's `class`, never a key or its name): admissions and
refusals by limit, audio seconds charged, live requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

KEY_ADMISSIONS = "voxmesh_key_admissions_total"
KEY_AUDIO_SECONDS = "voxmesh_key_audio_seconds_total"
KEY_LIVE_REQUESTS = "voxmesh_key_live_requests"
ADMITTED = "admitted"


class KeyClassMetrics:
    """Counters and a gauge labelled by key class, in the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.admissions = Counter(KEY_ADMISSIONS, "Calls checked against their key's limits, by key class and "
                                  "outcome (admitted, or the limit's code)", ["key_class", "outcome"],
                                  registry=registry)
        self.audio_seconds = Counter(KEY_AUDIO_SECONDS, "Audio seconds charged to keys' daily quotas, by key class",
                                     ["key_class"], registry=registry)
        self.live = Gauge(KEY_LIVE_REQUESTS, "Requests this gateway holds, by key class", ["key_class"],
                          registry=registry)

    def admitted(self, key_class: str) -> None:
        self.admissions.labels(key_class=key_class, outcome=ADMITTED).inc()
        self.live.labels(key_class=key_class).inc()

    def released(self, key_class: str) -> None:
        self.live.labels(key_class=key_class).dec()

    def refused(self, key_class: str, code: str) -> None:
        self.admissions.labels(key_class=key_class, outcome=code).inc()

    def charged(self, key_class: str, seconds: float) -> None:
        self.audio_seconds.labels(key_class=key_class).inc(seconds)
