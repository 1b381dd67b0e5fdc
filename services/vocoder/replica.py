"""One vocoder replica: its partitions (a codes consumer and a re-decode responder each), its streams.

A control loop ticks once a period: it claims, hands over or notices the loss of partitions (live vocoders share
them, partitions.py), and checks the decode owners of in-flight requests. Shutdown stops fetching, lets the work
already taken finish (audio published, messages acked) and releases the partitions; the service lifecycle then
releases the lease, so that a standby vocoder takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.bus.claims import PartitionClaim
from services.metrics.timings import snapshots
from services.vocoder.audio import AudioPublisher
from services.vocoder.codec_worker import CodecWorker
from services.vocoder.decode_owner_watch import OwnerWatch
from services.vocoder.handler import CodesHandler
from services.vocoder.partition_consumer import PartitionConsumer
from services.vocoder.partitions import PartitionManager
from services.vocoder.redecode import Redecoder
from services.vocoder.request_end import TerminalPublisher
from services.vocoder.request_streams import StreamTable
from services.vocoder.stream_limit import DEFAULT_MAX_STREAMS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """What a replica needs beyond its connections (service.py derives it from the settings)."""

    replica: str
    num_partitions: int
    partitions: tuple[int, ...]
    max_streams: int = DEFAULT_MAX_STREAMS
    max_in_flight: int = 256
    fetch_batch: int = 64
    tick_s: float = 1.0
    lease_ttl_s: float = 3.0
    max_redecodes: int = 4
    decode_migration_grace_s: float = 30.0


@dataclass(slots=True)
class _Served:
    consumer: PartitionConsumer
    stop: asyncio.Event
    task: asyncio.Task
    redecode: Subscription


class VocoderReplica:
    """Wires the parts of a vocoder together and runs them until stopped."""

    def __init__(self, nc: Client, js: JetStreamContext, kv: KeyValue, codec: CodecWorker,
                 config: ReplicaConfig) -> None:
        self._nc, self._js, self._kv = nc, js, kv
        self.config = config
        self.codec = codec
        self.table = StreamTable(config.max_streams)
        self.audio = AudioPublisher(nc, js, replica=config.replica, sample_rate=codec.sample_rate,
                                    samples_per_frame=codec.samples_per_frame)
        self.terminal = TerminalPublisher(js, sample_rate=codec.sample_rate, samples_per_frame=codec.samples_per_frame)
        self.handler = CodesHandler(js, self.table, codec, self.audio, self.terminal)
        self.redecoder = Redecoder(nc, js, codec, self.audio, num_partitions=config.num_partitions,
                                   max_concurrent=config.max_redecodes)
        self.owner_watch = OwnerWatch(js, kv, self.table, self.terminal,
                                      migration_grace_s=config.decode_migration_grace_s)
        self.partitions = PartitionManager(kv, config.replica, config.partitions,
                                           num_partitions=config.num_partitions, patience_s=config.lease_ttl_s,
                                           on_gained=self._serve_partition, on_lost=self._lose_partition,
                                           on_released=self._hand_over_partition,
                                           load_of=lambda partition: len(self.table.in_partition(partition)))
        self._served: dict[int, _Served] = {}

    def stats(self) -> dict[str, Any]:
        """Counters since start and the present state, for the micro service's STATS and status endpoint."""
        return {
            "replica": self.config.replica,
            "partitions": sorted(self._served),
            "partitions_handed_off": self.partitions.num_handed_off,
            "active_streams": len(self.table),
            "messages_deferred": self.handler.num_deferred,
            "audio_chunks": self.audio.num_published,
            "codec_calls": self.codec.num_calls,
            "max_codec_batch": self.codec.max_batch_seen,
            "codec_seconds": snapshots(self.codec.timings),
            "terminals_published": self.terminal.num_won,
            "terminals_stood_down": self.terminal.num_lost,
            "terminals_by_code": dict(self.terminal.num_won_by_code),
            "decode_owners_lost": self.owner_watch.num_lost,
            "requests_awaiting_migration": self.owner_watch.num_awaiting_migration(),
            "redecodes": self.redecoder.num_served,
            "messages_termed": sum(s.consumer.pull.num_termed for s in self._served.values()),
            **self.codec.graph_status(),
            **self.codec.pass_status(),
            **self.codec.primed_status(),
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Claim partitions and watch decode owners until `stop` is set (then call `shutdown`)."""
        await self._control_loop(stop)

    async def _control_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._restart_failed_consumers()
                await self.partitions.reconcile()
                await self.owner_watch.check()
            except Exception:  # a bus hiccup: keep serving, retry next tick
                log.exception("control pass failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.tick_s)  # the control period, woken early by stop

    async def _restart_failed_consumers(self) -> None:
        """Serve every owned partition: a consumer that died (e.g. a fetch error while NATS reconnects) or never
        bound is bound again; the partition stays ours meanwhile."""
        for partition, served in list(self._served.items()):
            if not served.task.done() or served.stop.is_set():
                continue
            error = served.task.exception() if not served.task.cancelled() else None
            log.error("consumer of partition %d ended (%r); starting it again", partition, error)
            del self._served[partition]
            await served.redecode.unsubscribe()
        for partition, claim in self.partitions.owned.items():
            if partition not in self._served:  # claimed, but binding its consumer failed last time
                await self._serve_partition(partition, claim)

    async def _serve_partition(self, partition: int, claim: PartitionClaim) -> None:
        consumer = PartitionConsumer(self._js, self._nc, partition, self.handler,
                                     max_in_flight=self.config.max_in_flight, fetch_batch=self.config.fetch_batch)
        await consumer.bind()
        redecode = await self.redecoder.subscribe(partition)
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(consumer.run(stop), name=f"vocoder-p{partition}")
        self._served[partition] = _Served(consumer, stop, task, redecode)
        log.info("serving partition %d (epoch %d)", partition, claim.record.epoch)

    async def _lose_partition(self, partition: int) -> None:
        """Another vocoder owns it now: stop at once and forget its requests (the new owner rebuilds them)."""
        served = self._served.pop(partition, None)
        if served is not None:
            served.stop.set()
            await served.redecode.unsubscribe()
            served.task.cancel()
            await asyncio.gather(served.task, return_exceptions=True)
            await served.consumer.abort()
        for stream in self.table.in_partition(partition):
            self.table.release(stream.request_id, ended=False)

    async def _hand_over_partition(self, partition: int) -> None:
        """Another vocoder is short of its share: stop fetching, finish the work already taken (its audio published,
        its messages settled), then forget the partition's requests; the next owner rebuilds them from CODES, as
        after a clean exit. Only then does the caller delete the claim."""
        served = self._served.pop(partition, None)
        if served is not None:
            served.stop.set()
            await asyncio.gather(served.task, return_exceptions=True)
            try:
                await served.redecode.unsubscribe()
            except Exception as exc:  # a connection going away: the subscription goes with it
                log.warning("partition %d: re-decode unsubscribe failed: %r", partition, exc)
        for stream in self.table.in_partition(partition):
            self.table.release(stream.request_id, ended=False)

    async def shutdown(self) -> None:
        """Stop fetching, let the work already taken finish, release the partitions."""
        for served in self._served.values():
            served.stop.set()
        for partition, served in list(self._served.items()):
            await served.redecode.unsubscribe()
            await asyncio.gather(served.task, return_exceptions=True)
        self._served.clear()
        await self.redecoder.close()
        await self.partitions.release_all()
        log.info("vocoder %s stopped with %d requests in flight (a standby rebuilds them from CODES)",
                 self.config.replica, len(self.table))
