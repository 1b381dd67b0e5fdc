"""The few model operations the engine needs, in one place, over the model package's API.

Keeping them here means the runner reads as engine logic (batches, rows, frames) and a change of the
model package's surface touches one file. Every function is batched over rows; none keeps state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from services.model.loader import TTSModel
from services.model.prompt import Prompt, PromptRequest, build_prompt
from services.model.sampling import RowSampling, apply_repetition_penalty, sample
from services.model.talker_logits import TalkerLogitsProcessor

ReplayBuilder = Callable[[TTSModel, Prompt, torch.Tensor], torch.Tensor]
"""(model, prompt, frames [n, 16]) -> the exact input rows [L + n, H] of the prompt and n emitted frames."""


def make_prompt(model: TTSModel, request: PromptRequest, stream: torch.cuda.Stream | None = None) -> Prompt:
    """The request's prefill rows and trailing text, on the model's device.

    `stream` (CUDA): build on this side stream and wait for it alone, so admission never queues behind the steps
    running on the default stream (a host-to-device copy on the default stream waits for every step queued
    there). The result is complete on return and safe to read from the default stream: its memory is recorded
    as used there, so the allocator does not hand it to the side stream again while a step still reads it."""
    with torch.inference_mode():
        if stream is None:
            return build_prompt(model.talker, model.config, request)
        with torch.cuda.stream(stream):
            prompt = build_prompt(model.talker, model.config, request)
        stream.synchronize()
        used_by = torch.cuda.default_stream(stream.device)
        for tensor in (prompt.embeds, prompt.trailing, prompt.tts_pad):
            tensor.record_stream(used_by)
        return prompt


def num_prompt_rows(prompt: Prompt) -> int:
    return int(prompt.embeds.shape[0])


def prompt_rows(prompt: Prompt) -> torch.Tensor:
    return prompt.embeds


def frame_input_rows(
    model: TTSModel, prompts: Sequence[Prompt], codes: torch.Tensor, text_positions: Sequence[int],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Input rows [B, H] after each row's frame: E0(c0) + sum_j Ej(cj) + the request's trailing text row (into
    `out`, cast to its dtype, when given).

    Text row k is `trailing[k]`, or tts_pad past the end (as `Prompt.trailing_rows`); picking views and
    stacking them costs one kernel for the whole batch.
    """
    text = torch.stack(
        [p.trailing[k] if k < p.trailing.shape[0] else p.tts_pad for p, k in zip(prompts, text_positions)]
    )
    if out is None:
        return model.talker.embed_codes(codes) + text
    return torch.add(model.talker.embed_codes(codes), text, out=out)


def replay_rows(model: TTSModel, prompt: Prompt, frames: torch.Tensor) -> torch.Tensor:
    """Faithful replay input: the prompt rows, then frame k's full 16-code input plus text row k, k < n."""
    frames = frames.to(prompt.embeds.device)
    positions = torch.arange(frames.shape[0], device=frames.device)
    rows = model.talker.embed_codes(frames) + prompt.trailing_rows(positions)
    return torch.cat((prompt.embeds, rows))


def kv_pool_shape(model: TTSModel, num_blocks: int, block_size: int) -> tuple[int, ...]:
    return model.talker.kv_pool_shape(num_blocks, block_size)


def eos_id(model: TTSModel) -> int:
    return model.config.talker.codec_eos_id


def sample_frames(
    model: TTSModel, hidden: torch.Tensor, seen: torch.Tensor, num_frames: torch.Tensor,
    repetition_penalty: torch.Tensor, talker_rows: RowSampling, predictor_rows: RowSampling,
    min_new_frames: torch.Tensor | None = None,
) -> torch.Tensor:
    """All 16 codes [B, 16] of the next frame of each row; rows whose codebook 0 is EOS carry junk after it.

    hidden [B, H]: the talker's last hidden state per row; seen [B, V]: codebook-0 ids each row already
    generated; num_frames [B]; repetition_penalty [B]; min_new_frames [B] (frames before EOS may be drawn;
    None: the model's default of 2). Codebook 0 is processed as the reference does
    (penalty, EOS before min frames, control ids), then drawn with `sample(talker_rows, codebook=0)`;
    the code predictor draws codebook j with `sample(predictor_rows, codebook=j)`.
    """
    first = sample_codebook0(model, hidden, seen, num_frames, repetition_penalty, talker_rows, min_new_frames)
    # Every row goes through the predictor (EOS rows too): static shapes, and no device sync to filter them.
    rest = predict_rest(model, hidden, first, predictor_rows)
    return torch.cat((first[:, None], rest), dim=1)


def sample_codebook0(
    model: TTSModel, hidden: torch.Tensor, seen: torch.Tensor, num_frames: torch.Tensor,
    repetition_penalty: torch.Tensor, talker_rows: RowSampling, min_new_frames: torch.Tensor | None = None,
) -> torch.Tensor:
    """Codebook 0 [B] of each row's next frame: the talker's part of `sample_frames` (same arguments)."""
    logits = model.talker.logits(hidden).float()
    logits = apply_repetition_penalty(logits, seen, repetition_penalty)
    # The per-row penalty is applied above; the processor adds EOS and control-id suppression only.
    process = TalkerLogitsProcessor.for_config(model.config.talker, repetition_penalty=1.0)
    return sample(process(logits, seen, num_frames, min_new_frames), talker_rows, codebook=0, kernels=model.kernels)


def predict_rest(model: TTSModel, hidden: torch.Tensor, first: torch.Tensor,
                 predictor_rows: RowSampling) -> torch.Tensor:
    """Codebooks 1..15 [B, 15] of each row, from its talker hidden state [B, H] and codebook 0 [B]: the code
    predictor's part of a frame, the same whether it runs here or on a remote `mtp` replica (which builds
    `predictor_rows` from the rows' seeds and frame indices, so its draws are these draws)."""

    def choose(scores: torch.Tensor, codebook: int) -> torch.Tensor:
        return sample(scores, predictor_rows, codebook, kernels=model.kernels)

    return model.code_predictor.predict(hidden, first, choose)
