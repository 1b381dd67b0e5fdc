"""Offline generation of one request, frame by frame (MODEL.md, steps 4-6), without the engine.

It owns a private paged KV pool sized for the request, so it runs the same talker entry points (prefill,
decode step) and the same code-predictor step the services run. `max_new_tokens` bounds the frames
returned: the reference's `generate` counts its last, never-completed codebook-0 token too, so it returns
at most `max_new_tokens - 1` frames for the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from services.model.attention_batch import AttentionBatch
from services.model.code_predictor import ChooseCodes, greedy
from services.model.loader import TTSModel
from services.model.prompt import PromptRequest, build_prompt
from services.model.talker_logits import TalkerLogitsProcessor

BLOCK_SIZE = 16

ChooseFirst = Callable[[torch.Tensor, int], torch.Tensor]
"""(processed talker scores [B, V], frame index) -> codebook-0 ids [B]."""
CodesChooser = Callable[[int], ChooseCodes]
"""frame index -> the code predictor's chooser for that frame."""


@dataclass(slots=True)
class GenerationTrace:
    """What a run saw, for tests and debugging: raw talker logits per step, code-predictor logits per frame."""

    talker_logits: list[torch.Tensor] = field(default_factory=list)
    code_logits: list[torch.Tensor] = field(default_factory=list)


def greedy_first(scores: torch.Tensor, frame: int) -> torch.Tensor:
    return scores.argmax(dim=-1)


def _greedy_codes(frame: int) -> ChooseCodes:
    return greedy


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


def _recording(choose: ChooseCodes, sink: list[torch.Tensor]) -> ChooseCodes:
    def choose_and_record(logits: torch.Tensor, codebook: int) -> torch.Tensor:
        sink.append(logits.float())
        return choose(logits, codebook)

    return choose_and_record


@torch.inference_mode()
def generate(
    model: TTSModel,
    request: PromptRequest,
    max_new_tokens: int,
    repetition_penalty: float,
    choose_first: ChooseFirst = greedy_first,
    choose_codes: CodesChooser = _greedy_codes,
    trace: GenerationTrace | None = None,
) -> torch.Tensor:
    """Codes [frames, 16] (int64, on the CPU) of one request, ending before EOS or after max_new_tokens frames."""
    talker, predictor, device = model.talker, model.code_predictor, model.device
    prompt = build_prompt(talker, model.config, request)
    process = TalkerLogitsProcessor.for_config(model.config.talker, repetition_penalty)
    length = prompt.embeds.shape[0]
    num_blocks = -(-(length + max_new_tokens) // BLOCK_SIZE)
    pool = torch.zeros(talker.kv_pool_shape(num_blocks, BLOCK_SIZE), dtype=model.dtype, device=device)
    seen = process.new_seen(1, device)
    hidden = talker(prompt.embeds, _one_sequence(0, length, num_blocks, device), pool)[-1:]
    frames: list[torch.Tensor] = []
    for frame in range(max_new_tokens):
        logits = talker.logits(hidden)
        if trace is not None:
            trace.talker_logits.append(logits[0].float())
        first = choose_first(process(logits, seen, torch.tensor([frame], device=device)), frame)
        if int(first[0]) == model.config.talker.codec_eos_id:
            break
        seen[0, first[0]] = True
        choose = choose_codes(frame)
        if trace is not None:
            sink: list[torch.Tensor] = []
            choose = _recording(choose, sink)
        codes = torch.cat((first, predictor.predict(hidden, first, choose)[0]))
        if trace is not None:
            trace.code_logits.append(torch.cat(sink))
        frames.append(codes)
        if frame + 1 == max_new_tokens:
            break
        row = talker.embed_codes(codes[None]) + prompt.trailing_rows(torch.tensor([frame], device=device))
        hidden = talker(row, _one_sequence(length + frame, 1, num_blocks, device), pool)
    if not frames:
        return torch.zeros(0, model.config.talker.num_code_groups, dtype=torch.long)
    return torch.stack(frames).cpu()
