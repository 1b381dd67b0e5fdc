"""Running the reference's own `generate` greedily, with spies that record what it computed.

The spies wrap the reference talker's and code predictor's `generate` (HF generation) to ask for their raw
logits and to keep the prompt rows the reference built, then call the originals unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class ReferenceRun:
    codes: torch.Tensor
    """[frames, 16]"""
    prompt_embeds: torch.Tensor
    """[L, hidden]: the talker's prefill rows."""
    trailing: torch.Tensor
    """[N, hidden]: the trailing text rows."""
    talker_logits: list[torch.Tensor] = field(default_factory=list)
    """Raw codebook-0 logits [V] of every talker step."""
    code_logits: list[torch.Tensor] = field(default_factory=list)
    """Raw code-predictor logits [15, V] of every frame."""


@contextmanager
def _spies(model, run: dict):
    talker, predictor = model.talker, model.talker.code_predictor
    talker_generate, predictor_generate = talker.generate, predictor.generate

    def spy_talker(*args, **kwargs):
        run["prompt_embeds"] = kwargs["inputs_embeds"][0].clone()
        run["trailing"] = kwargs["trailing_text_hidden"][0].clone()
        result = talker_generate(*args, output_logits=True, **kwargs)
        run["talker_logits"] = [step[0].float() for step in result.logits]
        return result

    def spy_predictor(*args, **kwargs):
        result = predictor_generate(*args, output_logits=True, **kwargs)
        run["code_logits"].append(torch.cat(result.logits).float())
        return result

    talker.generate, predictor.generate = spy_talker, spy_predictor
    try:
        yield
    finally:
        del talker.generate, predictor.generate


def reference_generate(
    model,
    text_ids: list[int],
    instruct_ids: list[int] | None,
    speaker: str | None,
    language: str,
    non_streaming: bool,
    max_frames: int,
    repetition_penalty: float = 1.05,
    ref_ids: list[int] | None = None,
    voice_clone_prompt: dict | None = None,
) -> ReferenceRun:
    """Greedy codes and logits from the reference. It returns at most max_new_tokens - 1 frames, hence the +1.
    A base model clones the voice of `voice_clone_prompt` (the reference's own dict), in context with the ids of
    the templated reference transcript `ref_ids`."""
    run: dict = {"code_logits": []}
    with _spies(model, run), torch.no_grad():
        codes, _ = model.generate(
            input_ids=[torch.tensor([text_ids])],
            instruct_ids=[torch.tensor([instruct_ids]) if instruct_ids else None],
            ref_ids=[torch.tensor([ref_ids])] if ref_ids else None,
            voice_clone_prompt=voice_clone_prompt,
            languages=[language],
            speakers=[speaker],
            non_streaming_mode=non_streaming,
            max_new_tokens=max_frames + 1,
            do_sample=False,
            subtalker_dosample=False,
            repetition_penalty=repetition_penalty,
        )
    return ReferenceRun(codes=codes[0], **run)
