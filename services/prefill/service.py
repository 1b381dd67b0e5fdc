"""voxmesh prefill: pulls long prompts routed to it, runs their prefill and first frame on its own engine, offers the
prompt's KV blocks by UCX and hands the request to decode (`PrefillHandoff`), which fetches the blocks into its own
pool and continues from the first frame. The KV never travels over NATS. With a base checkpoint it also does a cloned
voice's reference-audio work (resampling, mel, speaker and codec encoders) and hands decode the ready voice prompt."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AsyncExitStack
from typing import Any

from nats.micro.request import Request

from messages import subjects
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM, prefill_consumer
from services.bus.pull_consumer import PullConsumer
from services.decode.capacity import EngineCapacity
from services.decode.request_check import ServedModel
from services.decode.service import build_engine, serve_with_engine, voice_prompts_of
from services.decode.worker import EngineWorker
from services.metrics.timings import snapshots
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.model.loader import TTSModel
from services.prefill.prompt_intake import PrefillIntake
from services.prefill.prefiller import Prefiller
from services.prefill.settings import PrefillSettings
from services.runtime.lifecycle import Endpoint, ServiceContext, ServiceParts, ServiceTask
from services.transfer.agent import KvTransferAgent

log = logging.getLogger(__name__)

SETTINGS = PrefillSettings


async def serve(settings: PrefillSettings, stop: asyncio.Event) -> None:
    """Serve until `stop`; then stop pulling and finish the prompts in hand (their hand-offs go out)."""
    await serve_with_engine(settings, "prefill", build_prefill, stop)


async def build_prefill(settings: PrefillSettings, model: TTSModel, served: ServedModel, worker: EngineWorker,
                        context: ServiceContext, stack: AsyncExitStack) -> ServiceParts:
    engine = await worker.run(build_engine, settings, model)
    agent = await KvTransferAgent.start(context.nc, context.replica, offers=True)
    stack.push_async_callback(agent.close)
    voices = await voice_prompts_of(settings, model, served, worker, context, stack)
    prefiller = Prefiller(engine, worker)
    capacity = EngineCapacity(engine)
    fingerprint = await asyncio.to_thread(checkpoint_fingerprint, settings.model_dir)
    intake = PrefillIntake(context.js, prefiller, agent, served, settings, context.replica, capacity, fingerprint,
                           voices)
    consumer = PullConsumer(context.js, context.nc, stream=REQUESTS_STREAM, durable=prefill_consumer(served.name),
                            message_type=SynthesisRequest, handler=intake.handle, capacity=capacity,
                            max_batch=settings.max_num_seqs, concurrent=True)

    async def pull(stop: asyncio.Event) -> None:
        await consumer.bind()
        try:
            await consumer.run(stop)
        finally:
            await consumer.close()

    def stats() -> dict[str, Any]:
        return {"prefilled": prefiller.num_prefilled, "refused": prefiller.num_refused,
                "handed_over": intake.counts.handed_over, "sent_to_decode": intake.counts.sent_to_decode,
                "voice_prompts_computed": voices.num_computed if voices is not None else 0,
                "voice_prompt_seconds": snapshots(voices.timings) if voices is not None else {},
                "kv_blocks": engine.num_blocks, "free_kv_blocks": engine.stats().num_free_kv_blocks}

    async def status(request: Request) -> None:
        await request.respond(json.dumps(stats()).encode())

    log.info("prefill %s serving %s (%d KV blocks, max %d prompts at once)", context.replica, settings.model_name,
             engine.num_blocks, settings.max_num_seqs)
    return ServiceParts(description="voxmesh prefill (remote prompt prefill, KV by UCX)", stats=stats,
                        endpoints=[Endpoint("status", subjects.admin("prefill", context.replica, "status"), status)],
                        tasks=[ServiceTask("intake", pull)], background=[ServiceTask("engine-loop", prefiller.run)])
