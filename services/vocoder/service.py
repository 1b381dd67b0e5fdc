"""voxmesh vocoder: turns the codec frames of its CODES partitions into streamed PCM, and ends each request.

It claims vocoder partitions (`part.<n>`), consumes `tts.codes.<n>.*` with a durable pull consumer per partition,
keeps one streaming codec state per request, publishes one AudioChunk per CodesChunk on `tts.audio.<id>`, publishes
the terminal event after the last chunk, answers re-decode requests on `tts.redecode.<n>`, and fails requests whose
decode replica died and that no other decode replica took over. Codec work runs on one worker thread, batched across
requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from nats.micro.request import Request

from messages import subjects
from services.metrics.from_stats import stats_registry, vocoder_families
from services.metrics.listener import metrics_listener
from services.runtime.common_settings import CommonSettings
from services.runtime.lifecycle import Endpoint, ServiceContext, ServiceParts, ServiceTask, micro_name, run_service
from services.runtime.replica_name import default_replica
from services.runtime.settings_schema import SettingsError, setting
from services.vocoder.codec_worker import DEFAULT_MAX_HOLD_S, DEFAULT_PRIMED_VOICES, CodecWorker
from services.vocoder.partitions import parse_partitions
from services.vocoder.replica import ReplicaConfig, VocoderReplica
from services.vocoder.stream_limit import DEFAULT_MAX_STREAMS

log = logging.getLogger(__name__)

SERVICE_NAME = micro_name("vocoder")
CODEC_SUBDIR = "speech_tokenizer"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class VocoderSettings(CommonSettings):
    """Settings of the vocoder service (plus the common ones)."""

    partitions: str = setting("all", "partitions to serve: 'all' (an even share of them among the live vocoders) or "
                                     "a comma-separated list like '0,2' (every one listed)")
    max_streams: int = setting(DEFAULT_MAX_STREAMS, "requests voiced at once; further requests wait on CODES (`voxmesh "
                                                    "up --max-num-seqs N` raises it to N)")
    max_decode_batch: int = setting(32, "codec chunks decoded together in one call (across requests)")
    max_in_flight: int = setting(256, "codes messages taken from a partition's consumer and not yet settled")
    lease_ttl_s: float = setting(3.0, "seconds after which others consider this replica dead")
    tick_s: float = setting(1.0, "lease renewal, partition and decode-owner check period (seconds)")
    max_redecodes: int = setting(4, "re-decodes replayed at once")
    primed_voices: int = setting(DEFAULT_PRIMED_VOICES, "codec states primed with a cloned voice's reference frames "
                                 "kept for the next request of the same voice (a few MB of device memory each; 0: "
                                 "none)")
    decode_migration_grace_s: float = setting(
        30.0, "seconds a request whose decode replica died may wait for another decode replica to take it over "
              "(migration) before the vocoder ends it with code replica_lost")
    codec_batching: bool = setting(True, "decode chunks of several requests in one codec call (faster on a GPU); "
                                         "off: each chunk alone, so re-decoded bytes match the first time's exactly "
                                         "even under load (a conv's result can differ by batch size in the last bit)")
    codec_hold_ms: float = setting(DEFAULT_MAX_HOLD_S * 1000, "the longest a chunk whose listener has audio in "
                                   "hand waits, when the codec is free, for other chunks to share its call (fewer, "
                                   "fuller passes under load; a first chunk never waits; 0: none waits)")
    codec_urgent_passes: bool = setting(True, "a chunk whose listener has under 100 ms of audio in hand (a first "
                                        "chunk above all) runs in a codec pass of its own ahead of the call's "
                                        "others, instead of padded into a longer pass that would cost less; off: "
                                        "passes are planned for the fewest padded frames alone")
    metrics_port: int = setting(0, "port of the Prometheus /metrics listener (0: off)",
                                env="VOXMESH_VOCODER_METRICS_PORT")
    metrics_host: str = setting("127.0.0.1", "address the /metrics listener binds (loopback by default; 0.0.0.0 "
                                "lets another host scrape it)", env="VOXMESH_VOCODER_METRICS_HOST")

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_decode_batch", "max_in_flight", "max_redecodes", "num_partitions"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}")
        if not 0 < self.tick_s < self.lease_ttl_s:
            raise SettingsError(f"--tick-s ({self.tick_s}) must be > 0 and below --lease-ttl-s ({self.lease_ttl_s})")
        if not 0 <= self.codec_hold_ms <= 1000:
            raise SettingsError(f"--codec-hold-ms: must be between 0 and 1000, got {self.codec_hold_ms}")
        if self.primed_voices < 0:
            raise SettingsError(f"--primed-voices: must be >= 0, got {self.primed_voices}")
        if not self.decode_migration_grace_s >= 0:
            raise SettingsError(f"--decode-migration-grace-s: must be >= 0, got {self.decode_migration_grace_s}")
        parse_partitions(self.partitions, self.num_partitions)
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"--metrics-port / VOXMESH_VOCODER_METRICS_PORT: {self.metrics_port} is not a TCP "
                                "port (0..65535; 0: off)")

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(
            replica=self.replica or default_replica("vocoder"), num_partitions=self.num_partitions,
            partitions=parse_partitions(self.partitions, self.num_partitions), max_streams=self.max_streams,
            max_in_flight=self.max_in_flight, tick_s=self.tick_s, lease_ttl_s=self.lease_ttl_s,
            max_redecodes=self.max_redecodes, decode_migration_grace_s=self.decode_migration_grace_s)


SETTINGS = VocoderSettings


def codec_dir(settings: CommonSettings) -> Path:
    """`<model_dir>/speech_tokenizer`, checked to exist."""
    if not settings.model_dir:
        raise SettingsError("--model-dir / VOXMESH_MODEL_DIR: the vocoder needs a checkpoint directory")
    path = Path(settings.model_dir) / CODEC_SUBDIR
    if not path.is_dir():
        raise SettingsError(f"--model-dir: {path} does not exist (a checkpoint has its codec in {CODEC_SUBDIR}/)")
    return path


async def load_codec(settings: VocoderSettings, max_batch: int) -> CodecWorker:
    """Load the codec decoder on the worker thread that will run it (torch never runs on the event loop)."""
    from services.model.codec import load_codec_decoder

    # One codec slot per stream the replica admits: its table holds max_streams, its re-decodes max_redecodes.
    return await CodecWorker.load(load_codec_decoder, codec_dir(settings), settings.device, _DTYPES[settings.dtype],
                                  settings.kernel_choices(),
                                  max_streams=settings.max_streams + settings.max_redecodes, max_batch=max_batch,
                                  batch_across_requests=settings.codec_batching,
                                  primed_voices=settings.primed_voices, primes_voices=clones_voices(settings),
                                  max_hold_s=settings.codec_hold_ms / 1000,
                                  urgent_passes=settings.codec_urgent_passes)


def clones_voices(settings: VocoderSettings) -> bool:
    """Whether the checkpoint clones voices from reference audio (a base one): only then are the codec's priming
    passes prepared at start (CUDA graphs, a few hundred MiB). One whose config cannot be read is assumed to."""
    from services.model.config import load_config
    from services.model.errors import ModelError

    try:
        return load_config(Path(settings.model_dir))[0].tts_model_type == "base"
    except (ModelError, OSError, ValueError) as exc:
        log.warning("could not read the checkpoint's model type (%s); preparing the priming of cloned voices", exc)
        return True


async def serve(settings: VocoderSettings, stop: asyncio.Event, codec: CodecWorker | None = None) -> None:
    """Run one vocoder replica until `stop` is set, then drain. `codec`: one loaded already (it is closed here)."""
    if codec is None:
        codec = await load_codec(settings, settings.max_decode_batch)
    try:
        await run_service(settings, "vocoder", functools.partial(build_vocoder, settings, codec), stop)
    finally:
        await codec.close()


async def build_vocoder(settings: VocoderSettings, codec: CodecWorker, context: ServiceContext,
                        stack: AsyncExitStack) -> ServiceParts:
    """The vocoder's parts: the control loop (partitions, decode owners) until stop; on the way out the replica
    finishes the work it took and releases its partitions; the `status` endpoint; STATS with its counters."""
    config = dataclasses.replace(settings.replica_config(), replica=context.replica)
    replica = VocoderReplica(context.nc, context.js, context.kv, codec, config)
    await stack.enter_async_context(metrics_listener(stats_registry(replica.stats, vocoder_families),
                                                     settings.metrics_port, settings.metrics_host))

    async def status(request: Request) -> None:
        await request.respond(json.dumps(replica.stats()).encode())

    return ServiceParts(
        description=__doc__.splitlines()[0],
        stats=replica.stats,
        endpoints=[Endpoint("status", status_subject(config.replica), status)],
        tasks=[ServiceTask("control-loop", replica.run)],
        drain=replica.shutdown,
        lease_interval_s=config.tick_s,
        lease_ttl_s=config.lease_ttl_s,
    )


def status_subject(replica: str) -> str:
    """Per-replica admin subject of the status endpoint (not in messages/subjects.py yet: asked the bus owner)."""
    return subjects.admin("vocoder", replica, "status")
