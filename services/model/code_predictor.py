"""The code predictor ("MTP"): codebooks 1..15 of a frame from the talker's hidden state and codebook 0.

`predict` is one batched step: B rows in, 15 codes per row out. It keeps no state between calls (every
frame starts a fresh context at position 0), so any replica can serve any row; the randomness comes from
the `choose` callable, which the caller keys by (seed, frame, codebook).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from services.kernels import fused_small_attention
from services.model import small_attention
from services.model.config import CodePredictorConfig, TalkerConfig
from services.model.layers import DecoderStack


class ChooseCodes(Protocol):
    """Pick one code per row from logits [B, V] for `codebook` (1..15); returns int64 [B]."""

    def __call__(self, logits: torch.Tensor, codebook: int) -> torch.Tensor: ...


def greedy(logits: torch.Tensor, codebook: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


class _DenseCache:
    """The `Attend` of one predict call: a [layers, 2, B, Hkv, S, D] cache filled left to right."""

    def __init__(self, cfg: CodePredictorConfig, rows: int, like: torch.Tensor, fused: bool) -> None:
        d = cfg.decoder
        self.fused = fused
        """Whether the fused kernel may serve (the model's start-up verdict on its device)."""
        shape = (d.num_layers, 2, rows, d.num_kv_heads, cfg.num_code_groups, d.head_dim)
        self.kv = torch.empty(shape, dtype=like.dtype, device=like.device)
        self.scale = d.head_dim**-0.5
        self.start = 0

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [B, n, Hq, D], k and v [B, n, Hkv, D]; one launch where the fused kernel serves, the torch form elsewhere
        if self.fused and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1:
            return fused_small_attention.small_attention(self.kv[layer], self.start, q, k, v, self.scale)
        return small_attention.torch_form(self.kv[layer], self.start, q, k, v, self.scale)

    def attend_projected(self, layer: int, qkv: torch.Tensor, num_heads: int,
                         norms: fused_small_attention.HeadNorms) -> torch.Tensor | None:
        """Attention straight from the projection's output qkv [B, n, width], q and k normed and rotated in the same
        launch (see `AttendsProjected`); None where that kernel does not serve: the layer norms and rotates first."""
        if not self.fused:
            return None
        return fused_small_attention.small_attention_projected(self.kv[layer], self.start, qkv, num_heads, norms,
                                                               self.scale)


class CodePredictor(nn.Module):
    CHECKPOINT_PREFIXES = (
        ("model.", "talker.code_predictor.model."),
        ("codec_embedding.", "talker.code_predictor.model.codec_embedding."),
        ("lm_head.", "talker.code_predictor.lm_head."),
        ("small_to_mtp_projection.", "talker.code_predictor.small_to_mtp_projection."),
        ("first_embedding.", "talker.model.codec_embedding."),
    )
    """(module prefix, checkpoint prefix) of every parameter."""

    def __init__(self, talker_cfg: TalkerConfig) -> None:
        super().__init__()
        cfg = talker_cfg.code_predictor
        self.cfg = cfg
        talker_hidden, hidden = talker_cfg.decoder.hidden_size, cfg.decoder.hidden_size
        self.model = DecoderStack(cfg.decoder)
        groups = cfg.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(groups))
        self.lm_head = nn.ModuleList(nn.Linear(hidden, cfg.vocab_size, bias=False) for _ in range(groups))
        self.small_to_mtp_projection = (
            nn.Linear(talker_hidden, hidden, bias=True) if hidden != talker_hidden else nn.Identity()
        )
        self.first_embedding = nn.Embedding(talker_cfg.vocab_size, talker_hidden)
        """The talker's codec embedding (E0): the second input row is E0(codebook 0)."""
        self.fused_attention = False
        """Whether the fused attention kernel serves (`kernels.fused_small_attention`): the loader sets the start-up
        check's verdict on the model's device."""

    def predict(self, hidden: torch.Tensor, first_codes: torch.Tensor, choose: ChooseCodes = greedy) -> torch.Tensor:
        """Codebooks 1..groups-1 [B, groups-1] for talker hidden states [B, talker_hidden] and codebook 0 [B]."""
        rows = hidden.shape[0]
        cache = _DenseCache(self.cfg, rows, hidden, self.fused_attention)
        x = torch.stack((hidden, self.first_embedding(first_codes)), dim=1)
        codes = []
        for j in range(self.cfg.num_code_groups - 1):
            positions = torch.arange(cache.start, cache.start + x.shape[1], device=hidden.device)
            out = self.model(self.small_to_mtp_projection(x), positions, cache)
            cache.start += x.shape[1]
            code = choose(self.lm_head[j](out[:, -1]), j + 1)
            codes.append(code)
            x = self.codec_embedding[j](code)[:, None]
        return torch.stack(codes, dim=1)
