"""Metrics a service updates as things happen (the gateway's): request outcomes, first-packet latency, RTF, queue
depth and active streams, in a registry of its own.

Each instance owns its registry, so several services in one process (the tests) never mix their numbers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.metrics import names


class RequestMetrics:
    """The request-level metrics of one service instance.

    Attributes:
        registry: what `/metrics` renders.
        requests: counter by outcome and code.
        first_packet: histogram of seconds to the first audio.
        rtf: histogram of real-time factors of finished requests.
        queue_depth: gauge of waiting requests (set when scraped).
        active_streams: gauge of requests in flight.
        live_requests: gauge of requests the service holds anything for (set when scraped).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(names.REQUESTS, "Requests ended, by outcome and error code", ["outcome", "code"],
                                registry=self.registry)
        self.first_packet = Histogram(names.FIRST_PACKET, "Seconds from admission to the first audio chunk",
                                      buckets=names.LATENCY_BUCKETS, registry=self.registry)
        self.rtf = Histogram(names.RTF, "Real-time factor of finished requests (wall seconds / audio seconds)",
                             buckets=names.RTF_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge(names.QUEUE_DEPTH, "Requests waiting on the REQUESTS stream",
                                 registry=self.registry)
        self.active_streams = Gauge(names.ACTIVE_STREAMS, "Client requests being streamed now",
                                    registry=self.registry)
        self.live_requests = Gauge(names.LIVE_REQUESTS, "Requests held here (queued, generating, streaming, awaiting "
                                   "a resume)", registry=self.registry)

    def count(self, outcome: str, code: str | None = None) -> None:
        """One request ended with `outcome` (and error `code`, if any)."""
        self.requests.labels(outcome=outcome, code=code or names.NO_CODE).inc()
