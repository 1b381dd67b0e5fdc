"""voxmesh mtp: a stateless code-predictor replica. It answers StepRequests on its own subject (`tts.mtp.<replica>.step`)
with codebooks 1..15 of each row and its load, computing one step at a time on a worker thread; decode finds it by its
lease (`lease.<replica>`, service mtp) and sends each step to the least-loaded live replica.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass

from messages import subjects
from services.model.loader import DTYPES
from services.mtp.predictor import LoadedPredictor
from services.mtp.step_server import StepServer
from services.mtp.predictor_thread import PredictorWorker
from services.runtime.common_settings import CommonSettings
from services.runtime.lifecycle import Endpoint, ServiceContext, ServiceParts, ServiceTask, micro_name, run_service
from services.runtime.settings_schema import SettingsError, setting

log = logging.getLogger(__name__)

SERVICE = "mtp"
SERVICE_NAME = micro_name(SERVICE)


@dataclass(frozen=True, slots=True)
class MtpSettings(CommonSettings):
    """Settings of the code-predictor service (plus the common ones: --model-dir, --device, --dtype ...)."""

    max_queued_steps: int = setting(256, "steps taken and not yet answered; one more is refused with queue_full (the "
                                         "caller sends it to another replica)")
    lease_ttl_s: float = setting(3.0, "seconds after which others consider this replica dead")
    tick_s: float = setting(1.0, "lease renewal period (seconds)")
    cuda_graphs: bool = setting(True, "on CUDA, replay each step as a CUDA graph (one per rows bucket and sampling "
                                      "mode, captured at start-up)")
    max_step_rows: int = setting(64, "the largest step replayed as a graph (decode's --max-num-seqs); larger steps "
                                     "run eagerly")

    def __post_init__(self) -> None:
        if self.max_queued_steps < 1 or self.max_step_rows < 1:
            raise SettingsError(f"--max-queued-steps ({self.max_queued_steps}) and --max-step-rows "
                                f"({self.max_step_rows}) must be >= 1")
        if not 0 < self.tick_s < self.lease_ttl_s:
            raise SettingsError(f"--tick-s ({self.tick_s}) must be > 0 and below --lease-ttl-s ({self.lease_ttl_s})")


SETTINGS = MtpSettings


async def serve(settings: MtpSettings, stop: asyncio.Event) -> None:
    """Serve steps until `stop` is set; then answer the steps already taken, release the lease and drain."""
    if settings.model_dir is None:
        raise SettingsError("--model-dir / VOXMESH_MODEL_DIR: the mtp service needs a checkpoint directory")
    worker = PredictorWorker()
    try:
        graph_rows = settings.max_step_rows if settings.cuda_graphs else None
        predictor = await worker.run(LoadedPredictor.load, settings.model_dir, DTYPES[settings.dtype],
                                     settings.device, graph_rows, settings.kernel_choices())
        await run_service(settings, SERVICE, functools.partial(build_mtp, settings, predictor, worker), stop)
    finally:
        worker.close()


async def build_mtp(settings: MtpSettings, predictor: LoadedPredictor, worker: PredictorWorker,
                    context: ServiceContext, stack: AsyncExitStack) -> ServiceParts:
    """The replica's parts: the `step` endpoint on its own subject, the compute loop (it answers every step taken
    before it returns), STATS with its counters and load."""
    server = StepServer(predictor, worker, context.replica, settings.max_queued_steps)
    log.info("mtp %s serving checkpoint %s (%s, %s) on %s", context.replica, predictor.fingerprint,
             predictor.dtype_name, settings.device, subjects.mtp_step(context.replica))
    return ServiceParts(
        description="voxmesh mtp (code predictor replica)",
        stats=server.stats,
        endpoints=[Endpoint("step", subjects.mtp_step(context.replica), server.handle,
                            metadata={"body": "StepRequest (msgpack)", "reply": "StepReply (msgpack)"})],
        background=[ServiceTask("steps", server.run)],
        drain=server.drain,
        metadata={"fingerprint": predictor.fingerprint},
        lease_interval_s=settings.tick_s,
        lease_ttl_s=settings.lease_ttl_s,
    )
