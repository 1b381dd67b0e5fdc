"""Per-request state of the decode engine: what is needed to continue a request faithfully.

A request's token stream in the talker's KV cache is its prompt (L tokens) followed by one token
per emitted frame, whose input embedding depends on all 16 codes of that frame and on one row of
trailing text. So the state keeps every emitted frame in full, the text position, and the seed:
from those a replay rebuilds the exact input of every step (MODEL.md, "Sampling that survives replay").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from services.model.talker_logits import MIN_NEW_TOKENS
from services.model.sampling import SamplingParams

NUM_CODEBOOKS = 16


class SequenceStatus(enum.IntEnum):
    """Ordered: every status from FINISHED_EOS on is terminal, so `status >= FINISHED_EOS` means ended."""

    WAITING = 0
    """Queued, never run."""
    RUNNING = 1
    """Holding KV blocks; prefilling or decoding."""
    PREEMPTED = 2
    """Blocks freed and queued again; the next prefill replays its stored frames."""
    FINISHED_EOS = 3
    """The talker produced EOS."""
    FINISHED_LENGTH = 4
    """Reached its frame budget (runaway guard or max_model_len)."""
    CANCELLED = 5
    """Aborted by the caller."""
    FAILED = 6
    """Ended by the engine with a failure code (capacity, preempted, drained)."""

    @property
    def is_finished(self) -> bool:
        return self >= SequenceStatus.FINISHED_EOS


class FailureCode(enum.StrEnum):
    """Machine-readable codes of the engine's failed outcomes."""

    CAPACITY = "capacity"
    PREEMPTED = "preempted"
    DRAINED = "drained"
    STEP_FAILED = "step_failed"


class Sequence:
    """One request inside the engine. The scheduler reads token counts; the runner reads the prompt and frames."""

    __slots__ = (
        "request_id", "prompt", "num_prompt_tokens", "seed", "params", "predictor_params", "max_new_frames", "min_new_frames",
        "status",
        "num_computed_tokens", "text_position", "block_table", "prefill_embeds", "num_preemptions",
        "num_pending_frames", "handed_kv", "exports_kv", "is_batch", "_frames", "_num_frames",
    )

    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        seed: int,
        params: SamplingParams,
        max_new_frames: int,
        prompt: Any | None = None,
        predictor_params: SamplingParams | None = None,
        min_new_frames: int = MIN_NEW_TOKENS,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        """The model's Prompt (prefill embeddings, trailing text); None only in model-free scheduler tests."""
        self.num_prompt_tokens = num_prompt_tokens
        self.seed = seed
        self.params = params
        """How the talker samples codebook 0 (its repetition penalty included)."""
        self.predictor_params = predictor_params or params
        """How the code predictor samples codebooks 1..15 (the checkpoint's `subtalker_*` settings)."""
        self.max_new_frames = max_new_frames
        self.min_new_frames = min_new_frames
        """Frames before EOS may be drawn: 2 as the reference, or max_new_frames to ignore EOS (benchmarks)."""
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        """Tokens whose K/V are in this request's blocks."""
        self.text_position = 0
        """Rows of trailing text already consumed by inputs: the next decode input adds `text_row(text_position)`."""
        self.block_table: list[int] = []
        self.prefill_embeds: torch.Tensor | None = None
        """The rows a (possibly chunked) prefill reads: the prompt's, or a replay's; dropped when prefill ends."""
        self.num_preemptions = 0
        self.num_pending_frames = 0
        """Frames sampled by a step still running on the device (0 or 1): counted in `num_tokens` so the next
        step can be scheduled before their codes are back; applied by `append_frame` or dropped at a preemption."""
        self.handed_kv: torch.Tensor | None = None
        """KV of every token but the last frame's input, computed elsewhere (a remote prefill), in pool blocks
        [n, *block]: written into this request's first blocks when it is first scheduled, instead of a prefill."""
        self.exports_kv = False
        self.is_batch = False
        """A batch request: queued behind interactive ones, and preempted before any of them."""
        """Whether its outcome carries the KV of its prompt (a prefill replica's request)."""
        # numpy, not torch: a frame is appended per request per step, and a torch call each would release and
        # retake the interpreter lock that decode's event loop competes for.
        self._frames = np.zeros((8, NUM_CODEBOOKS), dtype=np.int64)
        self._num_frames = 0

    @property
    def num_frames(self) -> int:
        """Frames emitted so far; also the index of the frame the next sample produces."""
        return self._num_frames

    @property
    def num_sampled_frames(self) -> int:
        """Frames sampled so far, those still on the device included; the index of the frame the next sample draws."""
        return self._num_frames + self.num_pending_frames

    @property
    def num_tokens(self) -> int:
        """Tokens that must be in the cache before the next frame can be sampled (a pending frame's input included)."""
        return self.num_prompt_tokens + self._num_frames + self.num_pending_frames

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """More than one token to compute: a first prefill, a chunk of one, or a replay."""
        return self.num_uncomputed_tokens > 1 or self.num_computed_tokens < self.num_prompt_tokens

    @property
    def frames(self) -> torch.Tensor:
        """Every emitted frame, int64 [num_frames, 16] (a view; do not modify)."""
        return torch.from_numpy(self._frames[: self._num_frames])

    def append_frame(self, codes: np.ndarray | torch.Tensor) -> None:
        """Record a frame's 16 codes (int64 [16], on the host)."""
        if self._num_frames == self._frames.shape[0]:
            grown = np.zeros((2 * self._frames.shape[0], NUM_CODEBOOKS), dtype=np.int64)
            grown[: self._num_frames] = self._frames
            self._frames = grown
        self._frames[self._num_frames] = codes
        self._num_frames += 1

    def mark_computed(self, num_new_tokens: int) -> None:
        """Account for `num_new_tokens` tokens whose K/V the last step wrote."""
        self.num_computed_tokens += num_new_tokens
        self.text_position = max(0, self.num_computed_tokens - self.num_prompt_tokens)
        if not self.is_prefill:
            self.prefill_embeds = None

    def reset_for_replay(self) -> None:
        """After a preemption: nothing is cached any more; the frames, seed and params stay."""
        self.num_computed_tokens = 0
        self.text_position = 0
        self.prefill_embeds = None
        self.handed_kv = None  # the replay computes every token here
        self.num_pending_frames = 0  # a frame still on the device is dropped: the replay draws it again, the same
        self.num_preemptions += 1
        self.status = SequenceStatus.PREEMPTED


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How a request ended: finished (eos/length), cancelled, or failed with a code and an actionable reason."""

    request_id: str
    status: SequenceStatus
    """A terminal status (FINISHED_EOS, FINISHED_LENGTH, CANCELLED or FAILED)."""
    num_frames: int
    """Frames emitted before the end (all of them were already returned as frame outputs)."""
    code: FailureCode | None = None
    """Set when status is FAILED."""
    reason: str | None = None
    """For a failure: what happened and what to change, in words a person can act on."""
    kv_blocks: tuple[int, ...] = ()
    """For a request that exports its KV: the pool blocks of its prompt, freed but not yet reused (the engine
    gathers them into `prompt_kv` before its next step)."""
    prompt_kv: torch.Tensor | None = None
    """For a request that exports its KV and finished: its prompt's KV, pool blocks [n, *block] (a copy)."""

    @property
    def is_failed(self) -> bool:
        return self.status == SequenceStatus.FAILED
