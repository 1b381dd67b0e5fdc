"""Offline generation of one request, frame by frame (MODEL.md, steps 4-6), without the engine.

It owns a private paged KV pool sized for the request, so it runs the same talker entry points (prefill,
decode step) and the same code-predictor step the services run. `max_new_tokens` bounds the frames
returned: the reference's `generate` counts its last, never-completed codebook-0 token too, so it returns
at most `max_new_tokens - 1` frames for the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.model.attention_batch import AttentionBatch
from services.model.config import GenerationDefaults
from services.model.loader import TTSModel
from services.model.prompt import PromptRequest, build_prompt
from services.model.sampling import RowSampling, SamplingParams, sample
from services.model.talker_logits import TalkerLogitsProcessor

BLOCK_SIZE = 16


@dataclass(slots=True)
class GenerationTrace:
    """What a run saw, for tests and debugging: raw talker logits per step, code-predictor logits per frame."""

    talker_logits: list[torch.Tensor] = field(default_factory=list)
    code_logits: list[torch.Tensor] = field(default_factory=list)


def default_sampling(defaults: GenerationDefaults, greedy: bool = False) -> tuple[SamplingParams, SamplingParams]:
    """(talker, code predictor) sampling from a checkpoint's generation_config; greedy keeps only the penalty."""
    talker = SamplingParams(
        temperature=defaults.temperature if defaults.do_sample and not greedy else 0.0,
        top_k=defaults.top_k, top_p=defaults.top_p, repetition_penalty=defaults.repetition_penalty,
    )
    predictor = SamplingParams(
        temperature=defaults.subtalker_temperature if defaults.subtalker_dosample and not greedy else 0.0,
        top_k=defaults.subtalker_top_k, top_p=defaults.subtalker_top_p, repetition_penalty=1.0,
    )
    return talker, predictor


def _one_sequence(start: int, count: int, num_blocks: int, device: torch.device) -> AttentionBatch:
    """A batch of one sequence whose cache is blocks 0..num_blocks-1, adding `count` tokens at `start`."""
    positions = torch.arange(start, start + count, device=device)
    return AttentionBatch(
        positions=positions,
        slot_mapping=positions,
        query_start=torch.tensor([0, count], device=device),
        seq_lens=torch.tensor([start + count], device=device),
        block_tables=torch.arange(num_blocks, device=device)[None],
    )


class _FrameSampler:
    """Draws one frame's codes for a single request, keyed by (seed, frame, codebook) like the engine."""

    def __init__(
        self, model: TTSModel, talker: SamplingParams, predictor: SamplingParams, seed: int, trace: GenerationTrace | None,
        min_new_frames: int | None = None,
    ) -> None:
        self.model, self.talker, self.predictor, self.seed, self.trace = model, talker, predictor, seed, trace
        self.min_new_frames = min_new_frames
        self.process = TalkerLogitsProcessor.for_config(model.config.talker, talker.repetition_penalty)
        self.seen = self.process.new_seen(1, model.device)

    def first(self, hidden: torch.Tensor, frame: int) -> torch.Tensor:
        """Codebook 0 [1] after the talker's logit processing; marks it seen."""
        logits = self.model.talker.logits(hidden)
        if self.trace is not None:
            self.trace.talker_logits.append(logits[0].float())
        device = logits.device
        floor = None if self.min_new_frames is None else torch.tensor([self.min_new_frames], device=device)
        scores = self.process(logits, self.seen, torch.tensor([frame], device=device), floor)
        first = sample(scores, RowSampling.build([self.talker], [self.seed], [frame], device), codebook=0,
                       kernels=self.model.kernels)
        self.seen[0, first[0]] = True
        return first

    def rest(self, hidden: torch.Tensor, first: torch.Tensor, frame: int) -> torch.Tensor:
        """Codebooks 1..15 [15] from the code predictor."""
        rows = RowSampling.build([self.predictor], [self.seed], [frame], hidden.device)
        seen_logits: list[torch.Tensor] = []

        def choose(scores: torch.Tensor, codebook: int) -> torch.Tensor:
            seen_logits.append(scores.float())
            return sample(scores, rows, codebook, kernels=self.model.kernels)

        codes = self.model.code_predictor.predict(hidden, first, choose)[0]
        if self.trace is not None:
            self.trace.code_logits.append(torch.cat(seen_logits))
        return codes


@torch.inference_mode()
def generate(
    model: TTSModel,
    request: PromptRequest,
    max_new_tokens: int,
    talker_sampling: SamplingParams,
    predictor_sampling: SamplingParams,
    seed: int = 0,
    trace: GenerationTrace | None = None,
    ignore_eos: bool = False,
) -> torch.Tensor:
    """Codes [frames, 16] (int64, on the CPU) of one request, ending before EOS or after max_new_tokens frames.

    Draws are keyed by (seed, frame, codebook) exactly as in the engine, so a seeded run here gives the
    codes a seeded request through the mesh gives. `ignore_eos` never draws EOS, so exactly max_new_tokens
    frames come out (fixed-length runs, as the engine's `ignore_eos`).
    """
    talker, device = model.talker, model.device
    prompt = build_prompt(talker, model.config, request)
    sampler = _FrameSampler(model, talker_sampling, predictor_sampling, seed, trace,
                            min_new_frames=max_new_tokens if ignore_eos else None)
    length = prompt.embeds.shape[0]
    num_blocks = -(-(length + max_new_tokens) // BLOCK_SIZE)
    pool = torch.zeros(talker.kv_pool_shape(num_blocks, BLOCK_SIZE), dtype=model.dtype, device=device)
    hidden = talker(prompt.embeds, _one_sequence(0, length, num_blocks, device), pool)[-1:]
    frames: list[torch.Tensor] = []
    for frame in range(max_new_tokens):
        first = sampler.first(hidden, frame)
        if int(first[0]) == model.config.talker.codec_eos_id:
            break
        codes = torch.cat((first, sampler.rest(hidden, first, frame)))
        frames.append(codes)
        if frame + 1 == max_new_tokens:
            break
        row = talker.embed_codes(codes[None]) + prompt.trailing_rows(torch.tensor([frame], device=device))
        hidden = talker(row, _one_sequence(length + frame, 1, num_blocks, device), pool)
    if not frames:
        return torch.zeros(0, model.config.talker.num_code_groups, dtype=torch.long)
    return torch.stack(frames).cpu()
