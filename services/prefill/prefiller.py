"""The prefill replica's engine loop: prompts in, (first frame, prompt KV) out.

Each prompt runs in the decode engine with a budget of one frame and `exports_kv`: the engine batches prompts (and
chunks long ones) exactly as decode would, samples the first frame from the prompt's last hidden state with the
request's keyed sampler, and returns a copy of the prompt's KV blocks as the request ends. So the decode replica
that continues from them produces the codes a single replica would have.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import torch

from services.decode.request_check import Admission
from services.decode.worker import EngineWorker
from services.engine.engine import Engine
from services.engine.engine_request import EngineRequest
from services.engine.outputs import StepOutput
from services.engine.sequence import RequestOutcome

log = logging.getLogger(__name__)


class PrefillRefused(Exception):
    """The engine would not prefill this prompt (too long for its pool, an unusable prompt, a failed step)."""


@dataclass(frozen=True, slots=True)
class Prefilled:
    """What a decode replica needs beyond the request: the first frame and the prompt's KV blocks."""

    first_frame: torch.Tensor
    """int64 [16]."""
    prompt_kv: torch.Tensor
    """Pool blocks [n, layers, 2, block_size, kv_heads, head_dim], complete in memory (safe to send)."""
    num_prompt_tokens: int


class Prefiller:
    """Queues prompts in the engine and steps it while any is unfinished; each caller awaits its own result."""

    def __init__(self, engine: Engine, worker: EngineWorker) -> None:
        self.engine = engine
        self.worker = worker
        self._waiting: dict[str, asyncio.Future[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._work = asyncio.Event()
        self.num_prefilled = 0
        self.num_refused = 0

    async def prefill(self, key: str, admission: Admission) -> Prefilled:
        """The prompt of `admission` prefilled under engine id `key` (unique per delivery). Raises PrefillRefused."""
        future: asyncio.Future[tuple[torch.Tensor, torch.Tensor]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            outcome, num_prompt_tokens = await self.worker.run(_add, self.engine, key, admission)
            if outcome is not None:
                raise PrefillRefused(outcome.reason or f"the engine ended it at once ({outcome.status.name})")
            self._work.set()
            first_frame, prompt_kv = await future
            return Prefilled(first_frame, prompt_kv, num_prompt_tokens)
        except PrefillRefused:
            self.num_refused += 1
            raise
        except BaseException:
            await self.worker.run(self.engine.abort_request, key)  # cancelled or failed: its blocks come back
            raise
        finally:
            self._waiting.pop(key, None)

    async def run(self, stop: asyncio.Event) -> None:
        """Step while prompts are queued, until `stop`."""
        while not stop.is_set():
            self._work.clear()  # before the look: a prompt queued after it sets the flag again, and is not missed
            if not self.engine.has_unfinished():
                stopping = asyncio.ensure_future(stop.wait())
                working = asyncio.ensure_future(self._work.wait())
                await asyncio.wait((stopping, working), return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                working.cancel()
                continue
            output = await self.worker.run(self.engine.step)
            await self._settle(output)

    async def _settle(self, output: StepOutput) -> None:
        """Hand each finished prompt its first frame (sampled in the step that finished it) and its KV."""
        first_frames = {frame.request_id: frame.codes for frame in output.frames}
        done = []
        for outcome in output.outcomes:
            future = self._waiting.get(outcome.request_id)
            if future is None or future.done():
                continue
            first = first_frames.get(outcome.request_id)
            if outcome.prompt_kv is None or first is None:
                future.set_exception(PrefillRefused(_why(outcome)))
            else:
                done.append((future, first, outcome.prompt_kv))
        if done:
            await self.worker.run(_settled, [kv for _, _, kv in done])
        for future, first, kv in done:
            self.num_prefilled += 1
            if not future.done():
                future.set_result((first, kv))


def _add(engine: Engine, key: str, admission: Admission) -> tuple[RequestOutcome | None, int]:
    """(Engine thread.) Queue the prompt with a one-frame budget (the frame is drawn as decode would draw frame 0:
    a budget of one keeps EOS away from frame 0 as any budget does); its immediate outcome, and its length."""
    request = admission.request
    outcome = engine.add_request(EngineRequest(key, admission.prompt, request.seed, admission.params, 1,
                                               predictor_params=admission.predictor_params,
                                               ignore_eos=request.ignore_eos, min_new_frames=request.min_new_tokens,
                                               exports_kv=True))
    return outcome, engine.num_prompt_tokens(key) or 0


def _settled(kvs: list[torch.Tensor]) -> None:
    """(Engine thread.) The copies are queued on the device's stream: wait for them before anyone reads them by UCX."""
    if kvs[0].device.type == "cuda":
        torch.cuda.current_stream(kvs[0].device).synchronize()


def _why(outcome: RequestOutcome) -> str:
    return outcome.reason or f"the prefill ended as {outcome.status.name} without its KV"
