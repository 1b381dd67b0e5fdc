"""One request as the engine takes it (`Engine.add_request`): its prompt, sampling, frame budget and, for a
request that continues elsewhere's work, the frames and prompt KV it brings. Checked where it is built, so a request
the engine holds is one it can run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.errors import InvalidRequestError
from services.model.prompt import PromptRequest
from services.model.sampling import SamplingParams

_SEED_RANGE = (-(2**63), 2**64 - 1)
"""A seed is any signed or unsigned 64-bit integer (the keyed sampler hashes its 64 bits)."""


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request for the decode engine.

    Attributes:
        request_id: the request's id (non-empty; unique among the engine's requests).
        prompt: the text, voice and language to speak (the model builds the prompt rows from it).
        seed: keys every draw by (seed, frame, codebook), so any replay repeats them.
        params: how the talker samples codebook 0.
        max_new_frames: the frame budget (>= 1).
        predictor_params: how the code predictor samples codebooks 1..15 (None: as `params`).
        ignore_eos: keep EOS from being drawn before `max_new_frames` (fixed-length benchmarks).
        min_new_frames: keep EOS away for that many frames (>= 0; at least the model's minimum, at most the budget).
        frames: int [n, 16], frames this request already emitted on another replica (a migration): it continues
            from frame n, its first prefill replaying them exactly as after a preemption; one whose n frames already
            reach its budget ends at once, finished (length).
        prompt_kv: (with `frames`) the KV of every token but the last frame's input, computed by a prefill replica,
            as pool blocks [n, *block] (`ModelRunner.export_blocks`); written into the request's blocks when it is
            first scheduled. A preemption drops it and replays locally.
        exports_kv: the finished outcome carries the prompt's KV in `prompt_kv` (a prefill replica's request: a
            budget of one frame).
        is_batch: a batch request (`SynthesisRequest.priority`): it waits behind interactive requests and is
            preempted before any of them.

    Raises `InvalidRequestError` (code `invalid_request`) naming the field and the values it takes.
    """

    request_id: str
    prompt: PromptRequest
    seed: int
    params: SamplingParams
    max_new_frames: int
    predictor_params: SamplingParams | None = None
    ignore_eos: bool = False
    min_new_frames: int | None = None
    frames: torch.Tensor | None = None
    prompt_kv: torch.Tensor | None = None
    exports_kv: bool = False
    is_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {self.request_id!r}")
        _check_integer("max_new_frames", self.max_new_frames, 1, None)
        _check_integer("seed", self.seed, *_SEED_RANGE)
        if self.min_new_frames is not None:
            _check_integer("min_new_frames", self.min_new_frames, 0, None)
        if self.prompt_kv is not None and (self.frames is None or len(self.frames) < 1):
            raise InvalidRequestError("prompt_kv comes with the frames sampled from it (at least the first); "
                                      "send the frames too, or no prompt_kv to prefill here")


def _check_integer(name: str, value: object, low: int, high: int | None) -> None:
    """`value` is an integer (not a bool, which Python counts as one) in [low, high]."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequestError(f"{name} must be an integer {bounds}, got {value!r}")
