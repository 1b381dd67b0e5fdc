"""Metrics read from a service's own counters when scraped (decode, vocoder).

Those services already keep counters for their NATS micro STATS; a collector turns the same `stats()` dict into
Prometheus families at scrape time, so the hot paths carry no metrics code, and `/metrics` and `$SRV.STATS` never
disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from services.metrics import names

log = logging.getLogger(__name__)

Stats = Mapping[str, Any]
Families = Callable[[Stats], list]


class StatsCollector(Collector):
    """Calls `read_stats()` at each scrape and renders it with `families`."""

    def __init__(self, read_stats: Callable[[], Stats], families: Families) -> None:
        self._read_stats = read_stats
        self._families = families

    def collect(self) -> Iterator:
        try:
            stats = self._read_stats()
        except Exception:  # a scrape must not take the service down; the gap in the series shows it
            log.exception("could not read the service's stats for /metrics")
            return
        yield from self._families(stats)


def stats_registry(read_stats: Callable[[], Stats], families: Families) -> CollectorRegistry:
    """A registry holding one StatsCollector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(read_stats, families))
    return registry


def requests_family(ended: Mapping[tuple[str, str], int]) -> CounterMetricFamily:
    """`voxmesh_requests_total` from counts by (outcome, code)."""
    family = CounterMetricFamily(names.REQUESTS, "Requests ended, by outcome and error code",
                                 labels=["outcome", "code"])
    for (outcome, code), count in sorted(ended.items()):
        family.add_metric([outcome, code], count)
    return family


def decode_families(stats: Stats) -> list:
    """The decode replica's metrics from `DecodeParts.stats()`."""
    ended = {("finished", names.NO_CODE): stats["requests_finished"],
             ("stood_down", names.NO_CODE): stats["requests_stood_down"]}
    ended.update({("failed", code): count for code, count in stats.get("failures_by_code", {}).items()})
    return [
        requests_family(ended),
        CounterMetricFamily(names.PREEMPTIONS, "Capacity preemptions of running requests", stats["preemptions"]),
        CounterMetricFamily("voxmesh_migrations", "Requests taken over from a dead decode replica and continued here",
                            stats["requests_migrated"]),
        GaugeMetricFamily(names.KV_BLOCKS_IN_USE, "KV blocks held by requests", stats["kv_blocks_in_use"]),
        GaugeMetricFamily(names.KV_BLOCKS_CAPACITY, "KV blocks in the pool", stats["kv_blocks_total"]),
        GaugeMetricFamily(names.QUEUE_DEPTH, "Requests in the engine's waiting queue", stats["waiting_sequences"]),
        GaugeMetricFamily(names.ACTIVE_STREAMS, "Requests this replica owns", stats["active_requests"]),
        CounterMetricFamily("voxmesh_engine_steps", "Engine steps run", stats["steps"]),
        CounterMetricFamily("voxmesh_frames", "Codec frames generated", stats["frames"]),
        CounterMetricFamily("voxmesh_step_errors", "Engine steps that raised", stats["step_errors"]),
        GaugeMetricFamily("voxmesh_graph_capture_failures", "CUDA graphs that failed to capture and run eagerly",
                          stats["graph_capture_failures"]),
        *timings_families(names.STEP, "Seconds of the engine's steps, by part (device_decode, device_mixed: a step "
                          "on the card without and with a prefill chunk; idle: the card waiting for the host's next "
                          "step; launch: the host building and queueing one; launch_mixed: that for mixed steps "
                          "alone)",
                          stats.get("step_seconds", {})),
        *timings_families(names.VOICE_PROMPT, "Seconds a cloned voice's prompt took here, by part (audio_read: the "
                          "reference from its object store; compute: the audio work, its queue included)",
                          stats.get("voice_prompt_seconds", {})),
    ]


def timings_families(name: str, documentation: str, parts: Mapping[str, Mapping[str, Any]]) -> list:
    """One histogram family, labelled by part, from `Timings.snapshot()`s (none when no part is timed)."""
    if not parts:
        return []
    family = HistogramMetricFamily(name, documentation, labels=["part"])
    for part, snapshot in sorted(parts.items()):
        buckets = [(str(bound), count) for bound, count in snapshot["buckets"]]
        family.add_metric([part], buckets, snapshot["sum_s"])
    return [family]


def vocoder_families(stats: Stats) -> list:
    """The vocoder replica's metrics from `VocoderReplica.stats()`."""
    ended = {("finished" if code == "finished" else "failed", names.NO_CODE if code == "finished" else code): count
             for code, count in stats.get("terminals_by_code", {}).items()}
    return [
        requests_family(ended),
        GaugeMetricFamily(names.ACTIVE_STREAMS, "Requests with a codec state here", stats["active_streams"]),
        GaugeMetricFamily("voxmesh_partitions_owned", "Vocoder partitions this replica serves",
                          len(stats["partitions"])),
        CounterMetricFamily("voxmesh_audio_chunks", "Audio chunks published", stats["audio_chunks"]),
        CounterMetricFamily("voxmesh_codec_calls", "Codec decoder calls", stats["codec_calls"]),
        CounterMetricFamily("voxmesh_codec_passes", "Codec forward passes (a call runs one or more)",
                            stats.get("codec_passes", 0)),
        CounterMetricFamily("voxmesh_codec_row_frames", "Frames the codec's passes decoded for requests",
                            stats.get("codec_row_frames", 0)),
        CounterMetricFamily("voxmesh_codec_padded_row_frames", "Rows x frames the codec's passes ran, padding "
                            "included", stats.get("codec_padded_row_frames", 0)),
        CounterMetricFamily("voxmesh_redecodes", "Re-decode requests served", stats["redecodes"]),
        CounterMetricFamily("voxmesh_decode_owners_lost", "Requests failed because their decode replica died",
                            stats["decode_owners_lost"]),
        GaugeMetricFamily("voxmesh_graph_capture_failures", "CUDA graphs that failed to capture and run eagerly",
                          stats["codec_capture_failures"]),
        CounterMetricFamily("voxmesh_codec_voices_primed", "Codec states primed with a cloned voice's reference "
                            "frames", stats.get("codec_voices_primed", 0)),
        CounterMetricFamily("voxmesh_codec_voices_reused", "Cloned voices whose primed codec state was kept from an "
                            "earlier request", stats.get("codec_voices_reused", 0)),
        GaugeMetricFamily("voxmesh_codec_voices_kept_bytes", "Device memory of the primed codec states kept",
                          stats.get("codec_voices_kept_bytes", 0)),
        *timings_families(names.CODEC, "Seconds of the codec, by part (call: one batched call on its thread; chunk: "
                          "one chunk from its hand-over to its audio, the queue included; prime: one stream primed "
                          "with a reference's frames, or a kept priming copied in)",
                          stats.get("codec_seconds", {})),
    ]
