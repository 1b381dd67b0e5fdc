"""voxmesh decode: pulls synthesis requests when it has room, runs the talker + code predictor with continuous
batching over a paged KV pool, and publishes each request's codec frames in chunks to its vocoder partition."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import torch

from messages import subjects
from services.decode.cancel import CancelWatcher
from services.decode.core import DecodeCore
from services.decode.drain import Drainer, drain_subject
from services.decode.intake import Intake
from services.decode.launch_turns import LaunchTurns
from services.decode.loop import FrameLoop
from services.decode.request_check import ServedModel
from services.decode.settings import DecodeSettings
from services.decode.shutdown import finish_or_end
from services.decode.stats import StepSeconds
from services.decode.voice_prompts import VoicePrompts
from services.decode.voice_work import ProcessPromptMaker, ThreadPromptMaker, uses_process
from services.decode.worker import EngineWorker
from services.engine.config import StageConfig, StageKind
from services.engine.engine import Engine
from services.engine.launch_listener import LaunchListener
from services.engine.step_timeline import Record
from services.metrics.from_stats import decode_families, stats_registry
from services.metrics.listener import metrics_listener
from services.metrics.timings import snapshots
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.model.config import load_config
from services.model.loader import DTYPES, TTSModel, load_model
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from services.mtp.client import RemotePredictor
from services.runtime.lifecycle import Endpoint, ServiceContext, ServiceParts, ServiceTask, micro_name, run_service
from services.runtime.settings_schema import SettingsError

log = logging.getLogger(__name__)

SETTINGS = DecodeSettings
MTP_START_TIMEOUT_S = 300.0  # the mtp replicas load the same checkpoint as decode, beside it
SERVICE_NAME = micro_name("decode")


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
        report["launch_waits"] = self.core.turns.num_waits
        report["handoffs_fetched"] = self.intake.handoffs.num_fetched
        report["handoffs_fetch_failed"] = self.intake.handoffs.num_failed
        voices = self.core.voices
        report["voice_prompts_computed"] = voices.num_computed if voices is not None else 0
        report["voice_prompts_handed_over"] = voices.num_primed if voices is not None else 0
        report["voice_prompt_seconds"] = snapshots(voices.timings) if voices is not None else {}
        report["step_seconds"] = snapshots(self.core.step_seconds.timings)
        return report


async def serve(settings: DecodeSettings, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; then stop pulling, let owned requests finish (up to the grace period), end the
    rest with `drained`, release the lease and drain the connection."""
    await serve_with_engine(settings, "decode", build_decode, stop)


EngineServiceBuilder = Callable[[Any, TTSModel, ServedModel, EngineWorker, ServiceContext, AsyncExitStack],
                                Awaitable[ServiceParts]]


async def serve_with_engine(settings: DecodeSettings, service: str, build: EngineServiceBuilder,
                            stop: asyncio.Event) -> None:
    """Load the checkpoint on the engine's own thread, then run `service` built by `build(settings, model, served,
    worker, ...)`, which builds its engine (`build_engine`) with the collaborators it has once connected (decode,
    and prefill, which runs the same engine)."""
    if settings.model_dir is None:
        raise SettingsError(f"--model-dir / VOXMESH_MODEL_DIR: {service} needs a checkpoint directory")
    worker = EngineWorker(f"{service}-engine")
    try:
        model, served = await worker.run(load_checkpoint, settings)
        await run_service(settings, service, functools.partial(build, settings, model, served, worker), stop)
    finally:
        worker.close()


def load_checkpoint(settings: DecodeSettings) -> tuple[TTSModel, ServedModel]:
    """(On the engine thread.) Load the checkpoint's model, configuration and tokenizer."""
    torch.set_num_threads(settings.torch_threads)
    model = load_model(settings.model_dir, dtype=DTYPES[settings.dtype], device=settings.device,
                       choices=settings.kernel_choices())
    config, generation = load_config(model.directory)
    served = ServedModel(settings.model_name, config, generation, TextTokenizer.from_dir(settings.model_dir))
    return model, served


def build_engine(settings: DecodeSettings, model: TTSModel, remote_predictor: RemotePredictor | None = None,
                 step_sink: Record | None = None, launch_listener: LaunchListener | None = None) -> Engine:
    """(On the engine thread.) The engine with the settings' limits and its collaborators (`Engine` says each);
    it captures its graphs before it returns, so the replica serves its first requests at full speed."""
    stage = StageConfig(StageKind.TALKER, recompute_preemption=settings.preemption_mode)
    return Engine(model, settings.engine_config(), stage, remote_predictor=remote_predictor, step_sink=step_sink,
                  launch_listener=launch_listener)


async def voice_prompts_of(settings: DecodeSettings, model: TTSModel, served: ServedModel, worker: EngineWorker,
                           context: ServiceContext, stack: AsyncExitStack) -> VoicePrompts | None:
    """A base checkpoint's voice cloning (decode's, or a prefill replica's): its encoders loaded once before serving,
    in a child process or on the engine thread (`voice_work`); None for a checkpoint that does not clone."""
    if served.config.tts_model_type != "base":
        return None
    if uses_process(settings.voice_work, settings.device):
        maker = ProcessPromptMaker(settings.model_dir, DTYPES[settings.dtype], settings.device, served.tokenizer,
                                   workers=settings.voice_workers)
        stack.callback(maker.close)  # also when waiting for it fails
        await maker.ready()
        log.info("reference audio becomes voice prompts in child processes %s", maker.process_ids)
    else:
        maker = ThreadPromptMaker(await worker.run(VoiceCloner.load, model, served.tokenizer))
    voices = VoicePrompts(context.js, maker, settings.model_name)
    stack.callback(voices.close)
    return voices


async def _remote_predictor(settings: DecodeSettings, context: ServiceContext,
                            stack: AsyncExitStack) -> RemotePredictor | None:
    """The `mtp` topology: codebooks 1..15 from remote replicas (started; `wait_for_replicas` says when they are
    live); None in every other topology."""
    if settings.mtp_replicas == 0:
        return None
    fingerprint = await asyncio.to_thread(checkpoint_fingerprint, settings.model_dir)
    predictor = RemotePredictor(context.nc, asyncio.get_running_loop(), fingerprint, timeout_s=settings.mtp_timeout_s,
                                attempts=settings.mtp_attempts)
    stack.push_async_callback(predictor.close)
    await predictor.start(context.kv)
    return predictor


async def build_decode(settings: DecodeSettings, model: TTSModel, served: ServedModel, worker: EngineWorker,
                       context: ServiceContext, stack: AsyncExitStack) -> ServiceParts:
    """Decode's parts: intake pulls until stop; the frame loop and cancel watch serve owned requests until they
    are finished or ended (`finish_or_end`); the `drain` endpoint; STATS with the engine's counters."""
    predictor = await _remote_predictor(settings, context, stack)
    step_seconds, turns = StepSeconds(), LaunchTurns(asyncio.get_running_loop())
    engine = await worker.run(build_engine, settings, model, predictor, step_seconds.record, turns)
    if predictor is not None:  # the replicas load beside the engine's build; they must be live before any step
        log.info("waiting for %d mtp replica(s)", settings.mtp_replicas)
        await predictor.wait_for_replicas(settings.mtp_replicas, timeout_s=MTP_START_TIMEOUT_S)
    voices = await voice_prompts_of(settings, model, served, worker, context, stack)
    core = DecodeCore(nc=context.nc, js=context.js, kv=context.kv, engine=engine, worker=worker, served=served,
                      settings=settings, replica=context.replica, step_seconds=step_seconds, turns=turns,
                      voices=voices)
    parts = DecodeParts(core, Intake(core), FrameLoop(core, settings.steps_queued), CancelWatcher(core),
                        Drainer(core, context.stop))
    await stack.enter_async_context(metrics_listener(stats_registry(parts.stats, decode_families),
                                                     settings.metrics_port, settings.metrics_host))
    log.info("decode %s serving %s (%d KV blocks, max %d sequences, preemption %s)", context.replica,
             settings.model_name, engine.num_blocks, settings.max_num_seqs, settings.recompute_preemption)
    return ServiceParts(
        description="voxmesh decode (talker engine)",
        stats=parts.stats,
        endpoints=[Endpoint("drain", drain_subject(context.replica), parts.drainer.handle,
                            metadata={"body": '{"hold_s": seconds}, optional'})]
        + ([] if voices is None else [Endpoint("voice-create", subjects.voice_create(settings.model_name),
                                               voices.handle_create, metadata={"body": "VoiceCreate (msgpack)"})]),
        tasks=[ServiceTask("intake", parts.intake.run)],
        background=[ServiceTask("frame-loop", parts.loop.run), ServiceTask("cancel-watch", parts.cancels.run)],
        drain=functools.partial(finish_or_end, core, settings.shutdown_grace_s),
    )
