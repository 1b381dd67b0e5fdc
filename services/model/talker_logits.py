"""The talker's logit processing before sampling codebook 0, in the reference's order.

1. repetition penalty over the codebook-0 ids already generated for the request (each id once);
2. EOS suppressed until `min_new_tokens` frames exist;
3. the top 1024 ids of the vocabulary (control and speaker ids) suppressed, EOS excepted.
Temperature, top-k and top-p come after, in sampling. All of it runs in float32, as the reference does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.model.config import TalkerConfig

MIN_NEW_TOKENS = 2
NUM_SPECIAL_IDS = 1024


@dataclass(frozen=True, slots=True)
class TalkerLogitsProcessor:
    vocab_size: int
    eos_id: int
    repetition_penalty: float
    min_new_tokens: int = MIN_NEW_TOKENS

    @classmethod
    def for_config(cls, cfg: TalkerConfig, repetition_penalty: float) -> TalkerLogitsProcessor:
        return cls(vocab_size=cfg.vocab_size, eos_id=cfg.codec_eos_id, repetition_penalty=repetition_penalty)

    def __call__(self, logits: torch.Tensor, seen: torch.Tensor, num_frames: torch.Tensor,
                 min_new_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """logits [B, V]; seen [B, V] bool: ids generated so far; num_frames [B]: codebook-0 ids generated so far;
        min_new_tokens [B]: per-row frames before EOS may be drawn (None: `self.min_new_tokens` for every row;
        a row that ignores EOS passes its frame budget)."""
        scores = logits.float()
        if self.repetition_penalty != 1.0:
            penalised = torch.where(scores < 0, scores * self.repetition_penalty, scores / self.repetition_penalty)
            scores = torch.where(seen, penalised, scores)
        # Built from comparisons only (no indexed writes of host scalars), so a CUDA graph can capture it.
        ids = torch.arange(self.vocab_size, device=scores.device)
        is_eos = ids == self.eos_id
        special = (ids >= self.vocab_size - NUM_SPECIAL_IDS) & ~is_eos
        floor = self.min_new_tokens if min_new_tokens is None else min_new_tokens
        eos_held = (num_frames < floor)[:, None] & is_eos[None, :]
        return scores.masked_fill(special[None, :] | eos_held, float("-inf"))

    def new_seen(self, rows: int, device: torch.device) -> torch.Tensor:
        """An empty `seen` mask for `rows` requests."""
        return torch.zeros(rows, self.vocab_size, dtype=torch.bool, device=device)
