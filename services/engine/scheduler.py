"""Continuous batching over a paged KV pool, with the talker stage's preemption contract (DESIGN.md).

Each step the scheduler first gives every running request its next tokens (one for a decoding
request, a chunk for a prefilling one) in order, preempting from the end when the pool runs dry;
then, if nothing was preempted, it admits waiting requests while the token budget, `max_num_seqs`
and the pool allow. A preempted request either goes back to the front of its class in the queue
to be replayed from its stored frames (`allow`) or ends with one failed outcome (`fail`).

Both the queue and the running list hold interactive requests before batch ones (each class in
arrival order): interactive requests are admitted first when both wait, and the end preemption
takes from is the newest batch request while any batch request runs.

A step is applied in two parts, so that the next step can be scheduled while this one runs on the device:
`launched` (its tokens are in the cache, its sampled frames pending) when it is handed to the device, and
`update_from_output` (the codes: frames, EOS, budgets) when its codes are back. A request whose pending frame is
its last is not scheduled again; one whose pending frame turns out to be EOS ran one token for nothing, dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from services.engine.block_manager import BlockManager
from services.engine.config import EngineConfig, PreemptionMode
from services.engine.errors import DuplicateRequestError
from services.engine.outputs import FrameOutput, ModelRunnerOutput, ScheduledSequence, SchedulerOutput
from services.engine.sequence import FailureCode, RequestOutcome, Sequence, SequenceStatus

_PREEMPTED_REASON = (
    "the KV cache could not hold this request's next step, so it was preempted and the output generated so far "
    "is truncated; give the decode stage more KV memory (--kv-cache-blocks) or fewer concurrent sequences "
    "(--max-num-seqs)"
)
_DRAINED_REASON = (
    "the decode replica was drained by an operator (e.g. for a weight reload) and this stage does not replay "
    "preempted requests, so the output generated so far is truncated; retry the request"
)


class Scheduler:
    """Owns the waiting queue, the running set and the block manager; decides every step's batch."""

    def __init__(self, config: EngineConfig, num_blocks: int, mode: PreemptionMode) -> None:
        self.config = config
        self.mode = PreemptionMode(mode)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._is_draining = False

    # -- admission and removal -------------------------------------------------------------
    def add(self, seq: Sequence) -> RequestOutcome | None:
        """Queue a request; return its failed outcome at once (code `capacity`) when it can never fit."""
        if seq.request_id in self._by_id:
            raise DuplicateRequestError(f"request {seq.request_id!r} is already in the engine")
        refused = self.refusal(seq)
        if refused is not None:
            return refused
        self._by_id[seq.request_id] = seq
        _insert_in_class(self.waiting, seq, at_front=False)
        return None

    def refusal(self, seq: Sequence) -> RequestOutcome | None:
        """The failed outcome (code `capacity`) of a request that can never fit, else None with its frame budget
        capped to max_model_len. Reads only the configuration: safe from any thread."""
        too_big = self._capacity_reason(seq)
        if too_big is not None:
            seq.status = SequenceStatus.FAILED
            return RequestOutcome(seq.request_id, seq.status, 0, FailureCode.CAPACITY, too_big)
        seq.max_new_frames = min(seq.max_new_frames, self.config.max_model_len - seq.num_prompt_tokens + 1)
        return None

    def _capacity_reason(self, seq: Sequence) -> str | None:
        """Why this request cannot run even alone in the pool, or None if it can."""
        if seq.num_prompt_tokens > self.config.max_model_len:
            return (f"the prompt has {seq.num_prompt_tokens} tokens, more than max_model_len "
                    f"{self.config.max_model_len}; shorten the text")
        # Sampling frame k needs prompt + k tokens in the cache, so M frames need prompt + M - 1.
        peak_frames = min(seq.max_new_frames, self.config.max_model_len - seq.num_prompt_tokens + 1)
        peak_tokens = seq.num_prompt_tokens + peak_frames - 1
        needed = self.block_manager.num_blocks_for(peak_tokens)
        if needed <= self.block_manager.num_blocks:
            return None
        return (f"the request needs up to {needed} KV blocks (a {seq.num_prompt_tokens}-token prompt and up to "
                f"{peak_frames} frames) but the whole pool has {self.block_manager.num_blocks}; raise the KV memory "
                "(--kv-cache-blocks) or shorten the text")

    def abort(self, request_id: str) -> RequestOutcome | None:
        """Cancel a request now (blocks back at once); None when the id is unknown or already ended."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        return self._end(seq, SequenceStatus.CANCELLED)

    def _end(self, seq: Sequence, status: SequenceStatus, code: FailureCode | None = None,
             reason: str | None = None) -> RequestOutcome:
        """Release everything the request holds (it is already out of both queues) and report how it ended."""
        exported = ()
        if seq.exports_kv and status is SequenceStatus.FINISHED_LENGTH:
            exported = tuple(seq.block_table[: self.block_manager.num_blocks_for(seq.num_prompt_tokens)])
        self.block_manager.free(seq.block_table)
        seq.prefill_embeds = None
        seq.handed_kv = None
        seq.status = status
        del self._by_id[seq.request_id]
        return RequestOutcome(seq.request_id, status, seq.num_frames, code, reason, kv_blocks=exported)

    # -- the step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch. Preemptions and failures decided here are already applied."""
        out = SchedulerOutput()
        if self._is_draining:
            return out
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted_ids and not out.outcomes:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            if seq.num_sampled_frames >= seq.max_new_frames:
                index += 1  # its last frame is on the device: it ends when the codes are back
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._reserve(seq, num_new, out):
                break  # `seq` was the newest running request and is gone; nothing follows it.
            out.scheduled.append(ScheduledSequence.of(seq, seq.num_computed_tokens, num_new))
            budget -= num_new
            index += 1
        return budget

    def _reserve(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Grow `seq`'s blocks for `num_new` tokens, preempting the newest running requests as needed."""
        while not self.block_manager.append(seq.block_table, seq.num_computed_tokens + num_new):
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                # Cannot happen for requests admitted by `add` (they fit alone); kept so nothing loops.
                self.running.pop()
                out.outcomes.append(self._end(seq, SequenceStatus.FAILED, FailureCode.CAPACITY,
                                              "the request outgrew the whole KV pool; raise --kv-cache-blocks"))
                return False
            self._preempt(self.running.pop(), out)
            if victim is seq:
                return False
        return True

    def _preempt(self, victim: Sequence, out: SchedulerOutput) -> None:
        if self.mode is PreemptionMode.ALLOW:
            self.block_manager.free(victim.block_table)
            victim.reset_for_replay()
            _insert_in_class(self.waiting, victim, at_front=True)
            out.preempted_ids.append(victim.request_id)
        else:
            out.outcomes.append(self._end(victim, SequenceStatus.FAILED, FailureCode.PREEMPTED, _PREEMPTED_REASON))

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # A request whose KV was handed over computes only its last frame's input; the runner writes the rest.
            start = seq.num_tokens - 1 if seq.handed_kv is not None else 0
            num_new = min(seq.num_uncomputed_tokens - start, budget)
            if not self.block_manager.append(seq.block_table, start + num_new):
                break  # first come, first served within a class: later requests wait behind it
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = start
            seq.text_position = max(0, start - seq.num_prompt_tokens)
            _insert_in_class(self.running, seq, at_front=False)
            out.scheduled.append(ScheduledSequence.of(seq, start, num_new))
            budget -= num_new

    def launched(self, scheduled: list[ScheduledSequence]) -> None:
        """A step was handed to the device: its tokens count as cached, its sampled frames as pending."""
        for item in scheduled:
            seq = item.seq
            if seq.status != SequenceStatus.RUNNING or seq.num_preemptions != item.epoch:
                continue
            seq.mark_computed(item.num_new_tokens)
            if item.will_sample:
                seq.num_pending_frames += 1

    def update_from_output(
        self, scheduled: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> tuple[list[FrameOutput], list[RequestOutcome]]:
        """Apply a launched step's codes: record frames, end requests at EOS or their budget. A frame of a request
        that ended or was preempted since the launch is dropped (a replay draws it again)."""
        rows = {request_id: row for row, request_id in enumerate(runner_output.request_ids)}
        host_codes = runner_output.codes.numpy()  # rows by numpy indexing: no torch call per frame
        frames: list[FrameOutput] = []
        outcomes: list[RequestOutcome] = []
        for item in scheduled.scheduled:
            seq = item.seq
            if not item.will_sample or seq.status != SequenceStatus.RUNNING or seq.num_preemptions != item.epoch:
                continue
            seq.num_pending_frames -= 1
            row = rows[seq.request_id]
            if runner_output.is_eos[row]:
                self.running.remove(seq)
                outcomes.append(self._end(seq, SequenceStatus.FINISHED_EOS))
                continue
            codes = host_codes[row]
            seq.append_frame(codes)
            hidden = runner_output.hidden[row] if runner_output.hidden is not None else None
            frames.append(FrameOutput(seq.request_id, seq.num_frames - 1, torch.from_numpy(codes), hidden))
            if seq.num_frames >= seq.max_new_frames:
                self.running.remove(seq)
                outcomes.append(self._end(seq, SequenceStatus.FINISHED_LENGTH))
        return frames, outcomes

    def fail_scheduled(self, failed: list[ScheduledSequence], reason: str) -> list[RequestOutcome]:
        """End the requests of a step that made its model run raise (their blocks back at once)."""
        outcomes = []
        for item in failed:
            seq = item.seq
            if seq.status == SequenceStatus.RUNNING:
                self.running.remove(seq)
                outcomes.append(self._end(seq, SequenceStatus.FAILED, FailureCode.STEP_FAILED, reason))
        return outcomes

    # -- operator drain -------------------------------------------------------------------------
    @property
    def is_draining(self) -> bool:
        return self._is_draining

    def begin_drain(self) -> list[RequestOutcome]:
        """Stop running anything: `allow` requests are queued for a faithful replay, `fail` ones end `drained`."""
        self._is_draining = True
        outcomes: list[RequestOutcome] = []
        while self.running:
            seq = self.running.pop()  # newest first, so the queue keeps arrival order
            if self.mode is PreemptionMode.ALLOW:
                self.block_manager.free(seq.block_table)
                seq.reset_for_replay()
                _insert_in_class(self.waiting, seq, at_front=True)
            else:
                outcomes.append(self._end(seq, SequenceStatus.FAILED, FailureCode.DRAINED, _DRAINED_REASON))
        outcomes.reverse()
        return outcomes

    def end_drain(self) -> None:
        self._is_draining = False

    @contextmanager
    def drain(self) -> Iterator[list[RequestOutcome]]:
        """Drain scope: yields the outcomes of requests the drain ended; cleared even if the body raises."""
        try:
            yield self.begin_drain()
        finally:
            self.end_drain()

    # -- views for the service --------------------------------------------------------------------
    @property
    def num_unfinished(self) -> int:
        return len(self._by_id)

    def has_room(self) -> bool:
        """Whether a new request could start now (the service pulls from REQUESTS only then)."""
        return (not self._is_draining and not self.waiting and len(self.running) < self.config.max_num_seqs
                and self.block_manager.num_free_blocks > 0)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)


def _insert_in_class(queue: deque[Sequence] | list[Sequence], seq: Sequence, *, at_front: bool) -> None:
    """Put `seq` among the requests of its class (interactive ones before batch ones): at the front of its class
    (a preempted request, replayed first) or at its end (a new one)."""
    if seq.is_batch:
        index = next((i for i, other in enumerate(queue) if other.is_batch), len(queue)) if at_front else len(queue)
    else:
        index = 0 if at_front else next((i for i, other in enumerate(queue) if other.is_batch), len(queue))
    queue.insert(index, seq)
