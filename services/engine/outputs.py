"""The typed messages of one engine step: scheduler -> runner -> scheduler -> caller."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.engine.sequence import RequestOutcome, Sequence


@dataclass(frozen=True, slots=True)
class ScheduledSequence:
    """One request's share of a step: `num_new_tokens` tokens starting at position `start`.

    `will_sample` and `epoch` are fixed when the step is scheduled: with steps overlapped, the request's counts
    move on (the next step is scheduled) before this step's codes are applied."""

    seq: Sequence
    start: int
    """Tokens already in the cache (the position of the first new token)."""
    num_new_tokens: int
    will_sample: bool = False
    """Whether this step completes the request's tokens, so its last hidden state yields a frame."""
    epoch: int = 0
    """The request's preemption count when scheduled: a frame sampled before a later preemption is dropped."""

    @classmethod
    def of(cls, seq: Sequence, start: int, num_new_tokens: int) -> ScheduledSequence:
        return cls(seq, start, num_new_tokens, start + num_new_tokens == seq.num_tokens, seq.num_preemptions)


@dataclass(slots=True)
class SchedulerOutput:
    """What to run this step, and what the scheduler already ended or re-queued while deciding."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    """In batch order: the runner flattens their new tokens in this order."""
    preempted_ids: list[str] = field(default_factory=list)
    """Requests whose blocks were freed and that were re-queued for a faithful replay (allow mode)."""
    outcomes: list[RequestOutcome] = field(default_factory=list)
    """Requests ended while scheduling (preempted in fail mode, capacity); their blocks are already free."""

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def is_mixed(self) -> bool:
        """Whether a prompt's prefill runs in this step beside the decoding rows (a row with more than one token)."""
        return self.num_batched_tokens > len(self.scheduled)


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    """The frames sampled this step, one row per scheduled request whose tokens were completed."""

    request_ids: list[str]
    codes: torch.Tensor
    """int64 [B, 16] on the CPU; for an EOS row only column 0 (the EOS id) is meaningful."""
    is_eos: list[bool]
    hidden: torch.Tensor | None = None
    """The talker's final-normed hidden state of each row [B, H], when the engine captures it."""


@dataclass(frozen=True, slots=True)
class FrameOutput:
    """One emitted frame of one request."""

    request_id: str
    index: int
    """Frame index within the request (0 for the first frame)."""
    codes: torch.Tensor
    """int64 [16] on the CPU: codebook 0 from the talker, 1..15 from the code predictor."""
    hidden: torch.Tensor | None = None
    """The talker hidden state that produced this frame (only when the engine captures it)."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one `Engine.step()` produced: new frames, and requests that ended (exactly once each)."""

    frames: list[FrameOutput]
    outcomes: list[RequestOutcome]
    preempted_ids: list[str]
    """Requests re-queued for replay this step (informational: they continue later, no terminal event)."""
    num_batched_tokens: int
