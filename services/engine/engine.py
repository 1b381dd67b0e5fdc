"""The decode engine: requests in, frames and outcomes out, one bounded synchronous step at a time.

Made to sit inside an asyncio service: `add_request` and `abort_request` do no model work beyond
building a prompt and return at once; `step()` runs one batch and returns what happened (frames,
ended requests with their reasons) instead of printing or publishing anything.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from services.model.talker_logits import MIN_NEW_TOKENS
from services.engine import model_ops
from services.engine.config import EngineConfig, StageConfig, StageKind
from services.engine.engine_stats import EngineStats
from services.engine.talker_graphs import TalkerGraphSpec
from services.engine.engine_request import EngineRequest
from services.engine.errors import ConfigError, InvalidRequestError, RemoteStageFailed
from services.engine.in_flight_step import InFlightStep
from services.engine.launch_listener import LaunchListener
from services.engine.launch_pace import LaunchPace
from services.engine.outputs import SchedulerOutput, StepOutput
from services.engine.request_inbox import RequestInbox
from services.engine.runner import ModelRunner, RemotePredictorLike
from services.engine.scheduler import Scheduler
from services.engine.sequence import RequestOutcome, Sequence, SequenceStatus
from services.engine.step_isolation import isolate_failure
from services.engine.step_timeline import Record, StepTimeline
from services.model.loader import TTSModel


_log = logging.getLogger(__name__)


GRAPH_RESERVE_BYTES = 2 << 30
"""Kept out of a `gpu_memory_fraction` budget for what comes after the pool: the captured graphs' memory pool and
the eager fallbacks' activations (well under 2 GiB for the presets at the default limits; the start-up log line
says what the process really holds)."""


def pool_num_blocks(config: EngineConfig, model: TTSModel) -> int:
    """The pool size: `kv_cache_blocks`, or on CUDA what fits in `gpu_memory_fraction` of the card's total memory
    once this process's weights (memory it holds now) and `GRAPH_RESERVE_BYTES` are counted.

    A fraction of the total, not of the free memory: the vocoder may share the card, and what is free while it
    starts up races with it."""
    if config.kv_cache_blocks is not None:
        return config.kv_cache_blocks
    device = model.device
    if device.type != "cuda":
        raise ConfigError(f"gpu_memory_fraction needs a CUDA device, the model is on {device}; set kv_cache_blocks")
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(total * config.gpu_memory_fraction) - torch.cuda.memory_reserved(device) - GRAPH_RESERVE_BYTES
    shape = model_ops.kv_pool_shape(model, 1, config.block_size)
    bytes_per_block = torch.Size(shape).numel() * torch.empty((), dtype=model.dtype).element_size()
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ConfigError(f"gpu_memory_fraction {config.gpu_memory_fraction} of {total} bytes leaves no room for a KV "
                          f"block after the weights ({torch.cuda.memory_reserved(device)} bytes) and "
                          f"{GRAPH_RESERVE_BYTES} bytes for graphs; raise it")
    return num_blocks


class Engine:
    """Continuous-batching talker decode over a paged KV pool (one talker stage).

    Its collaborators come in here and stay for its life: `remote_predictor` (codebooks 1..15 from remote replicas,
    the `mtp` topology; None: drawn here), `step_sink` (takes each step's times by part, `StepTimeline`; None: kept
    by no one) and `launch_listener` (told when a step's launch begins and ends, where it only queues the step;
    decode's event loop holds its publishing meanwhile; None: no one is told).
    """

    def __init__(
        self,
        model: TTSModel,
        config: EngineConfig,
        stage: StageConfig | None = None,
        capture_hidden: bool = False,
        replay: model_ops.ReplayBuilder = model_ops.replay_rows,
        *,
        remote_predictor: RemotePredictorLike | None = None,
        step_sink: Record | None = None,
        launch_listener: LaunchListener | None = None,
    ) -> None:
        stage = stage or StageConfig(StageKind.TALKER)
        if stage.kind is not StageKind.TALKER:
            raise ConfigError(f"the decode engine runs the talker stage, got a {stage.kind.value} stage config")
        self.model = model
        self.config = config
        self.num_blocks = pool_num_blocks(config, model)
        self.scheduler = Scheduler(config, self.num_blocks, stage.preemption_mode)
        self.inbox = RequestInbox()
        """Admitted requests on their way to the scheduler (filled from any thread, emptied by the step thread)."""
        self._timeline = StepTimeline() if step_sink is None else StepTimeline(step_sink)
        """Each step's device, idle and launch times, handed to `step_sink`."""
        self._launch_listener = launch_listener or _UNTOLD
        """Told when a step's launch begins and ends, where it only queues the step (`_told_of_launches`)."""
        self._prompt_stream = torch.cuda.Stream(model.device) if model.device.type == "cuda" else None
        """Prompts are built on a side stream (CUDA), so admission does not wait behind the queued steps."""
        self._overlap = config.overlap_steps if config.overlap_steps is not None else model.device.type == "cuda"
        """Whether `step()` prepares the next step while the device runs this one (CUDA by default)."""
        self._overlap_min_rows = config.overlap_min_rows
        """Steps of fewer rows are not overlapped (a request arriving meanwhile waits for one step, not two)."""
        self._in_flight: tuple[SchedulerOutput, InFlightStep] | None = None
        """The launched step whose codes are not applied yet."""
        self._pace = LaunchPace() if config.late_launch else None
        """With `late_launch`: when to queue the next overlapped step."""
        self.runner = ModelRunner(model, self.num_blocks, config.block_size, capture_hidden, replay,
                                  TalkerGraphSpec.for_engine(config, model.device), config.max_num_seqs,
                                  remote_predictor)
        started = time.perf_counter()
        self.runner.prepare_graphs()  # before the replica serves: the first requests must not pay for captures
        if self.runner.talker_step is not None:
            device = model.device
            held = torch.cuda.memory_reserved(device)
            _log.info("captured the talker and sampling graphs in %.1f s (%d failed and run eagerly); %d KV blocks; "
                      "this process holds %.2f GiB, %.1f%% of the card", time.perf_counter() - started,
                      self.runner.num_capture_failures, self.num_blocks, held / 2**30,
                      100 * held / torch.cuda.get_device_properties(device).total_memory)

    def add_request(self, request: EngineRequest) -> RequestOutcome | None:
        """Queue a request. Returns its failed outcome at once (code `capacity`) if it can never fit the pool.

        Safe to call from another thread than the one that steps: the prompt is built on the caller's thread and
        the request joins the scheduler at the start of the next step (or abort), so admission never waits
        behind a running step. A request with `frames` continues from them; with `prompt_kv` too, only the last
        frame's input is computed here (`EngineRequest` says each field).

        Raises the model's `RequestError` for an unusable prompt (unknown speaker, empty text) and
        `InvalidRequestError` for a `prompt_kv` that does not fit this engine's pool; nothing is queued then.
        """
        prompt = model_ops.make_prompt(self.model, request.prompt, self._prompt_stream)
        budget = request.max_new_frames
        min_frames = budget if request.ignore_eos else min(max(MIN_NEW_TOKENS, request.min_new_frames or 0), budget)
        seq = Sequence(request.request_id, model_ops.num_prompt_rows(prompt), request.seed, request.params, budget,
                       prompt, request.predictor_params, min_new_frames=min_frames)
        refused = self.scheduler.refusal(seq)
        if refused is not None:
            return refused
        if request.frames is not None:
            for codes in torch.as_tensor(request.frames, dtype=torch.int64):
                seq.append_frame(codes)
            if seq.num_frames >= seq.max_new_frames:
                return RequestOutcome(request.request_id, SequenceStatus.FINISHED_LENGTH, seq.num_frames)
        if request.prompt_kv is not None:
            seq.handed_kv = self._checked_handed_kv(seq, request.prompt_kv)
        seq.exports_kv = request.exports_kv
        seq.is_batch = request.is_batch
        self.inbox.put(seq, self.scheduler)
        return None

    def kv_staging(self, num_tokens: int) -> torch.Tensor:
        """An empty buffer for the KV of `num_tokens` tokens as this engine's pool blocks ([n, layers, 2, block_size,
        kv_heads, head_dim], the pool's dtype and device): where a prefill replica's KV is received before it is
        handed to `add_request` (`EngineRequest.prompt_kv`)."""
        pool = self.runner.kv_pool
        num_blocks = self.scheduler.block_manager.num_blocks_for(num_tokens)
        return torch.empty((num_blocks, *pool.shape[1:]), dtype=pool.dtype, device=pool.device)

    def _checked_handed_kv(self, seq: Sequence, prompt_kv: torch.Tensor) -> torch.Tensor:
        num_blocks = self.scheduler.block_manager.num_blocks_for(seq.num_tokens - 1)
        expected = (num_blocks, *self.runner.kv_pool.shape[1:])
        if tuple(prompt_kv.shape) != expected or prompt_kv.dtype != self.runner.kv_pool.dtype:
            raise InvalidRequestError(f"prompt_kv is {tuple(prompt_kv.shape)} {prompt_kv.dtype}; this request's "
                                      f"{seq.num_tokens - 1} tokens need {expected} {self.runner.kv_pool.dtype}")
        return prompt_kv

    def abort_request(self, request_id: str) -> RequestOutcome | None:
        """Cancel a request; its blocks are free on return. None if the id is unknown or already ended."""
        self.inbox.hand_over(self.scheduler)
        self.runner.forget(request_id)
        return self.scheduler.abort(request_id)

    def step(self) -> StepOutput:
        """Schedule, run the model once, apply the results. Every ended request appears in exactly one output.

        With `overlap_steps`, the step is queued on the device and the previous one's codes are applied (and
        returned) after that: the host prepares step N+1 while the device runs step N, and a call returns the
        frames of the step before the one it launched. Otherwise a call returns the frames of its own step.

        If the model run raises, the request that makes it raise is found by re-running the step in halves
        (`step_isolation`) and ends with code `step_failed` (blocks freed); the others' frames are those of the
        re-run, and the engine keeps serving.
        """
        self._wait_for_launch_time()
        listener = self._told_of_launches()
        listener.begins()
        try:
            scheduled, launched, error = self._schedule_and_launch()
        finally:
            listener.ends()  # before any wait for the device: the other threads' turn
        output = StepOutput([], scheduled.outcomes, scheduled.preempted_ids, 0)
        if scheduled.is_empty:
            return self._collect(output)
        if error is not None:
            output = self._collect(output)  # the step before it first: its frames are the inputs of this one
            still_running = [item for item in scheduled.scheduled if item.seq.status is SequenceStatus.RUNNING]
            if isinstance(error, RemoteStageFailed):
                return _merged(output, self._fail_step(SchedulerOutput(still_running), error))
            return _merged(output, self._isolate(SchedulerOutput(still_running), error))
        self._timeline.launched(launched.launch_s)
        if self._pace is not None:
            self._pace.launched(time.perf_counter(), launched.launch_s, mixed=scheduled.is_mixed)
        self.scheduler.launched(scheduled.scheduled)
        previous, self._in_flight = self._in_flight, (scheduled, launched)
        output = self._apply(previous, output)
        if self._pace is not None and previous is not None:
            self._pace.arrived(time.perf_counter())
        overlaps = self._overlap and len(scheduled.scheduled) >= self._overlap_min_rows
        return output if overlaps else self._collect(output)

    def _wait_for_launch_time(self) -> None:
        """With `late_launch` and a step in flight: wait until it is about to end, or until a request arrives."""
        if self._pace is None or self._in_flight is None:
            return
        launch_at = self._pace.launch_at()
        if launch_at is not None:
            self.inbox.wait_for_arrival(launch_at)

    def _told_of_launches(self) -> LaunchListener:
        """The launch listener where a launch only queues the step (overlapped steps on the device, codebooks 1..15
        drawn here), so the device's run of it leaves the other threads a turn; else one that tells no one: a launch
        that runs the model itself (the CPU) or waits for remote predictors would keep them waiting a whole step."""
        if self._overlap and self.runner.remote_predictor is None:
            return self._launch_listener
        return _UNTOLD

    def _schedule_and_launch(self) -> tuple[SchedulerOutput, InFlightStep | None, Exception | None]:
        """The host's part of a step: admitted requests joined, the batch scheduled and queued on the device. Returns
        the schedule and the launched step (None when nothing was scheduled), or the error the launch raised."""
        self.inbox.hand_over(self.scheduler)
        scheduled = self.scheduler.schedule()
        self._forget(scheduled.outcomes, scheduled.preempted_ids)
        if scheduled.is_empty:
            return scheduled, None, None
        started = time.perf_counter()
        try:
            launched = self.runner.launch(scheduled.scheduled)
        except Exception as error:  # noqa: BLE001 - a failed step ends the request that failed it, not the replica
            return scheduled, None, error
        launched.launch_s = time.perf_counter() - started
        return scheduled, launched, None

    def _collect(self, output: StepOutput) -> StepOutput:
        """Apply the step in flight (if any) into `output`; nothing is in flight after this."""
        in_flight, self._in_flight = self._in_flight, None
        output = self._apply(in_flight, output)
        self._timeline.restart()  # nothing queued now: the stream's next wait is for work, not for the host
        if self._pace is not None:
            self._pace.restart()
        return output

    def _apply(self, launched: tuple[SchedulerOutput, InFlightStep] | None, output: StepOutput) -> StepOutput:
        """Wait for a launched step's codes and apply them (frames, ends) on top of `output`."""
        if launched is None:
            return output
        scheduled, step = launched
        frames, outcomes = self.scheduler.update_from_output(scheduled, step.result())
        self._timeline.applied(step.begun, step.arrived,
                              mixed=scheduled.is_mixed,
                              rows=len(scheduled.scheduled), tokens=scheduled.num_batched_tokens,
                              launch_s=step.launch_s)
        outcomes = [self._exported(outcome) for outcome in outcomes]
        self._forget(outcomes, [])
        return StepOutput(output.frames + frames, output.outcomes + outcomes, output.preempted_ids,
                          output.num_batched_tokens + scheduled.num_batched_tokens)

    def _exported(self, outcome: RequestOutcome) -> RequestOutcome:
        """An exporting request's outcome with its prompt's KV copied out of its blocks: they were freed just now,
        and no step that could reuse them has been queued yet (the one in flight was scheduled while it held them)."""
        if not outcome.kv_blocks:
            return outcome
        return dataclasses.replace(outcome, prompt_kv=self.runner.export_blocks(outcome.kv_blocks), kv_blocks=())

    def _fail_step(self, scheduled: SchedulerOutput, error: RemoteStageFailed) -> StepOutput:
        """After a step a remote stage could not serve: its requests end (blocks freed); the engine serves on."""
        _log.error("decode step of %d requests failed: %s", len(scheduled.scheduled), error)
        reason = f"{error}; the output generated so far is truncated; retry the request"
        failed = self.scheduler.fail_scheduled(scheduled.scheduled, reason)
        self._forget(failed, [])
        return StepOutput([], scheduled.outcomes + failed, scheduled.preempted_ids, 0)

    def _isolate(self, scheduled: SchedulerOutput, error: Exception) -> StepOutput:
        """After a raising step: fail the request(s) that make it raise, apply the others' re-run (once)."""
        _log.error("decode step of %d requests failed (%s: %s); isolating the request that fails it",
                   len(scheduled.scheduled), type(error).__name__, error)
        isolated = isolate_failure(self.runner.execute, scheduled.scheduled, error)
        cause = isolated.error
        _log.error("decode step failed for %s after %d re-runs", [item.seq.request_id for item in isolated.failed],
                   isolated.num_reruns, exc_info=cause)
        reason = (f"the decode step running this request failed ({type(cause).__name__}: {cause}); "
                  "the output generated so far is truncated; retry the request")
        failed = self.scheduler.fail_scheduled(isolated.failed, reason)
        frames, outcomes = [], []
        if isolated.output is not None:
            self.scheduler.launched(isolated.survivors)
            frames, outcomes = self.scheduler.update_from_output(SchedulerOutput(isolated.survivors),
                                                                 isolated.output)
        self._forget(failed + outcomes, [])
        return StepOutput(frames, scheduled.outcomes + failed + outcomes, scheduled.preempted_ids,
                          sum(item.num_new_tokens for item in isolated.survivors))

    @contextmanager
    def drain(self) -> Iterator[list[RequestOutcome]]:
        """Operator drain scope (e.g. around a weight reload): nothing runs inside it.

        `allow` requests are queued for a faithful replay after the scope; `fail` requests end with code
        `drained`, and their outcomes are yielded. The scope is cleared even if its body raises.
        """
        self.inbox.hand_over(self.scheduler)
        self.runner.forget_all()  # every running request leaves the running set
        with self.scheduler.drain() as ended:
            yield ended

    def num_prompt_tokens(self, request_id: str) -> int | None:
        """The prompt length of a queued or running request (None if unknown); safe from any thread."""
        seq = self.inbox.get(request_id) or self.scheduler.get(request_id)
        return None if seq is None else seq.num_prompt_tokens

    def _forget(self, outcomes: list[RequestOutcome], preempted_ids: list[str]) -> None:
        """Requests that left the running set give back their per-request rows in the runner."""
        for request_id in [outcome.request_id for outcome in outcomes] + preempted_ids:
            self.runner.forget(request_id)

    @property
    def num_unfinished(self) -> int:
        return self.scheduler.num_unfinished + len(self.inbox)

    def has_unfinished(self) -> bool:
        """Requests held, or a step in flight whose codes are not applied yet (the next `step()` applies them)."""
        return self.num_unfinished > 0 or self._in_flight is not None

    def has_room(self) -> bool:
        """Whether the service should pull another request now: fewer than max_num_seqs requests held, a free
        KV block, no drain. Requests may wait in the engine: admitted beside a step, they join the next one."""
        return (not self.scheduler.is_draining and self.num_unfinished < self.config.max_num_seqs
                and self.scheduler.block_manager.num_free_blocks > 0)

    # -- questions the service asks (never the scheduler's queues or the block manager) -----------------
    # Read from the event loop while the engine thread steps: each is a plain read of a size or a flag, so the
    # worst case is a value one step old.
    def stats(self) -> EngineStats:
        """Request counts and KV cache usage now."""
        scheduler = self.scheduler
        return EngineStats(num_waiting=len(scheduler.waiting) + len(self.inbox), num_running=len(scheduler.running),
                           num_kv_blocks=scheduler.block_manager.num_blocks,
                           num_free_kv_blocks=scheduler.block_manager.num_free_blocks,
                           is_draining=scheduler.is_draining,
                           num_graph_capture_failures=self.runner.num_capture_failures)

    @property
    def is_draining(self) -> bool:
        """An operator drain scope (`drain()`) is open: nothing runs, nothing new should be pulled."""
        return self.scheduler.is_draining


    def running_ids(self) -> list[str]:
        """The ids of the running batch, oldest first."""
        return [seq.request_id for seq in self.scheduler.running]


_UNTOLD = LaunchListener()
"""The listener of launches that are not reported (`Engine._told_of_launches`)."""


def _merged(first: StepOutput, second: StepOutput) -> StepOutput:
    """Two outputs of one `step()` call in order (a collected step, then a re-run after a failure)."""
    return StepOutput(first.frames + second.frames, first.outcomes + second.outcomes,
                      first.preempted_ids + second.preempted_ids, first.num_batched_tokens + second.num_batched_tokens)
