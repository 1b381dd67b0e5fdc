"""The talker: a Qwen3-style decoder over codec frames that predicts codebook 0 of the next frame.

One `forward` serves prefill and decode alike: a flattened batch of new input rows, their positions and
KV slots (`AttentionBatch`), and the engine's paged pool, which the forward writes into and reads from.
The talker also holds the 15 code-predictor embedding tables, because a frame's next input is the sum of
all 16 codebooks' embeddings (MODEL.md, step 6).
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.attention_batch import AttentionBatch, kv_pool_shape
from services.model.config import TalkerConfig
from services.model.layers import DecoderStack, TextProjection
from services.model.paged_attention import AttentionKernel, PagedAttention


class Talker(nn.Module):
    CHECKPOINT_PREFIXES = (
        ("model.", "talker.model."),
        ("codec_embedding.", "talker.model.codec_embedding."),
        ("text_embedding.", "talker.model.text_embedding."),
        ("text_projection.", "talker.text_projection."),
        ("codec_head.", "talker.codec_head."),
        ("codebook_embedding.", "talker.code_predictor.model.codec_embedding."),
    )
    """(module prefix, checkpoint prefix) of every parameter."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hidden = cfg.decoder.hidden_size
        self.model = DecoderStack(cfg.decoder)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, hidden)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.text_projection = TextProjection(cfg.text_hidden_size, hidden, cfg.decoder.hidden_act)
        self.codec_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        groups = cfg.num_code_groups - 1
        self.codebook_embedding = nn.ModuleList(nn.Embedding(cfg.code_predictor.vocab_size, hidden) for _ in range(groups))

    @property
    def hidden_size(self) -> int:
        return self.cfg.decoder.hidden_size

    def kv_pool_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        d = self.cfg.decoder
        return kv_pool_shape(num_blocks, d.num_layers, block_size, d.num_kv_heads, d.head_dim)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """P(ids): text embedding then projection to the talker width."""
        return self.text_projection(self.text_embedding(ids))

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """The codec part of a frame's input: E0(c0) + sum_j Ej(cj), codes [B, groups] -> [B, hidden]."""
        rows = [self.codec_embedding(codes[:, 0])]
        rows += [table(codes[:, j + 1]) for j, table in enumerate(self.codebook_embedding)]
        # Summed as one reduction over the stacked rows, the way the reference does it.
        return torch.stack(rows, dim=1).sum(dim=1)

    def forward(self, embeds: torch.Tensor, batch: AttentionBatch, kv_pool: torch.Tensor,
                kernel: AttentionKernel | None = None) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] for input rows embeds [T, hidden]; writes their K/V to the pool.

        The attention kernel is chosen by the batch's shape (a decode-only batch takes the sync-free decode
        path, which a CUDA graph can capture); `kernel` forces one (benchmarks and equality tests).
        """
        scale = self.cfg.decoder.head_dim**-0.5
        return self.model(embeds, batch.positions, PagedAttention(kv_pool, batch, scale, kernel))

    def last_hidden(self, hidden: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Each sequence's last new row, [B, hidden]."""
        return hidden[batch.query_start[1:] - 1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)
