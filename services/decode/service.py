"""voxmesh decode: pulls synthesis requests when it has room, runs the talker + code predictor with continuous
batching over a paged KV pool, and publishes each request's codec frames in chunks to its vocoder partition."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import torch
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.service import EndpointStats, Service

from services.bus.leases import LeaseKeeper
from services.bus.provision import open_bucket
from services.bus_session import connect_service
from services.decode.cancel import CancelWatcher
from services.decode.core import DecodeCore
from services.decode.drain import Drainer, drain_subject
from services.decode.intake import Intake
from services.decode.loop import FrameLoop
from services.decode.request_check import ServedModel
from services.decode.settings import DecodeSettings
from services.decode.shutdown import finish_or_end
from services.decode.worker import EngineWorker
from services.engine.config import StageConfig, StageKind
from services.engine.engine import Engine
from services.metrics.from_stats import decode_families, stats_registry
from services.metrics.listener import metrics_listener
from services.model.config import load_config
from services.model.loader import DTYPES, load_model
from services.model.text_tokenizer import TextTokenizer
from services.process import default_replica
from services.settings import SettingsError

log = logging.getLogger(__name__)

SETTINGS = DecodeSettings
SERVICE_NAME = "voxmesh-decode"
VERSION = "0.1.0"


@dataclass(slots=True)
class DecodeParts:
    """The running parts of one decode replica."""

    core: DecodeCore
    intake: Intake
    loop: FrameLoop
    cancels: CancelWatcher
    drainer: Drainer

    def stats(self) -> dict[str, Any]:
        report = self.core.stats.report(self.core.engine, len(self.core.active), self.intake.consumer.num_termed)
        report["drains"] = self.drainer.num_drains
        return report


async def serve(settings: DecodeSettings, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; then stop pulling, let owned requests finish (up to the grace period), end the
    rest with `drained`, release the lease and drain the connection."""
    if settings.model_dir is None:
        raise SettingsError("--model-dir / VOXMESH_MODEL_DIR: decode needs a checkpoint directory")
    replica = settings.replica or default_replica("decode")
    worker = EngineWorker()
    try:
        engine, served = await worker.run(load_engine, settings)
        nc = await connect_service(settings, f"{SERVICE_NAME}-{replica}")
        try:
            await _serve_connected(nc, settings, replica, engine, served, worker, stop)
        finally:
            if not nc.is_closed:
                await nc.drain()
    finally:
        worker.close()


def load_engine(settings: DecodeSettings) -> tuple[Engine, ServedModel]:
    """(On the engine thread.) Load the checkpoint and build the engine with the settings' limits."""
    torch.set_num_threads(settings.torch_threads)
    model = load_model(settings.model_dir, dtype=DTYPES[settings.dtype], device=settings.device)
    config, generation = load_config(model.directory)
    stage = StageConfig(StageKind.TALKER, recompute_preemption=settings.preemption_mode)
    engine = Engine(model, settings.engine_config(), stage)
    served = ServedModel(settings.model_name, config, generation, TextTokenizer.from_dir(settings.model_dir))
    return engine, served


async def _serve_connected(nc: Client, settings: DecodeSettings, replica: str, engine: Engine,
                           served: ServedModel, worker: EngineWorker, stop: asyncio.Event) -> None:
    js = nc.jetstream()
    kv = await open_bucket(js)
    core = DecodeCore(nc=nc, js=js, kv=kv, engine=engine, worker=worker, served=served, settings=settings,
                      replica=replica)
    halt = asyncio.Event()  # stops everything but the intake, once owned requests are done
    parts = DecodeParts(core, Intake(core), FrameLoop(core), CancelWatcher(core), Drainer(core, stop))
    lease = LeaseKeeper(kv, replica, "decode")
    async with AsyncExitStack() as stack:
        micro = await register(nc, parts, replica)
        stack.push_async_callback(micro.stop)
        await stack.enter_async_context(metrics_listener(stats_registry(parts.stats, decode_families),
                                                         settings.metrics_port))
        await lease.renew()  # live before the first pull, so a vocoder never sees an owner without a lease
        log.info("decode %s serving %s (%d KV blocks, max %d sequences, preemption %s)", replica,
                 settings.model_name, engine.num_blocks, settings.max_num_seqs, settings.recompute_preemption)
        async with asyncio.TaskGroup() as group:
            group.create_task(lease.run(halt), name="lease")
            group.create_task(parts.loop.run(halt), name="frame-loop")
            group.create_task(parts.cancels.run(halt), name="cancel-watch")
            await parts.intake.run(stop)
            await finish_or_end(core, settings.shutdown_grace_s)
            halt.set()
    log.info("decode %s stopped", replica)


async def register(nc: Client, parts: DecodeParts, replica: str) -> Service:
    """The `voxmesh-decode` micro service: PING/INFO, STATS carrying the engine's counters, and `drain`."""

    def stats_handler(_endpoint: EndpointStats) -> dict[str, Any]:
        return parts.stats()

    micro = await add_service(nc, name=SERVICE_NAME, version=VERSION, description="voxmesh decode (talker engine)",
                              metadata={"replica": replica}, stats_handler=stats_handler)
    await micro.add_endpoint(name="drain", subject=drain_subject(replica), handler=parts.drainer.handle,
                             metadata={"body": '{"hold_s": seconds}, optional'})
    return micro
