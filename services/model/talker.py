"""The talker: a Qwen3-style decoder over codec frames that predicts codebook 0 of the next frame.

One `forward` serves prefill and decode alike: a flattened batch of new input rows, their positions and
KV slots (`AttentionBatch`), and the engine's paged pool, which the forward writes into and reads from.
The talker also holds the 15 code-predictor embedding tables, because a frame's next input is the sum of
all 16 codebooks' embeddings (MODEL.md, step 6).
"""

from __future__ import annotations

import itertools

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
        """The codec part of a frame's input: E0(c0) + sum_j Ej(cj), codes [B, groups] -> [B, hidden].

        One lookup in the 16 tables joined end to end (`_joined_tables`), then one sum over the groups: 3 kernels
        where a lookup a table takes 18, on a path every decode step runs eagerly on the host, where each launch
        costs the engine thread its dispatch. The rows and their reduction are the ones the reference stacks and
        sums, so the result is the same to the bit. The joined copy costs the tables'
        size once more (69 MB for the 0.6B model in bfloat16, 138 MB for the 1.7B)."""
        joined = self._joined_tables()
        if joined is None:
            rows = [self.codec_embedding(codes[:, 0])]
            rows += [table(codes[:, j + 1]) for j, table in enumerate(self.codebook_embedding)]
            return torch.stack(rows, dim=1).sum(dim=1)
        table, offsets = joined
        return nn.functional.embedding(codes + offsets, table).sum(dim=1)

    def _joined_tables(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The codebooks' tables in one [sum of vocabularies, hidden] tensor and each group's first row in it; rebuilt
        when a weight was replaced (its pointer differs) or, for weights outside inference mode, changed in place
        (its version differs; inference-mode weights, as the loader makes them, keep no version). None while a CUDA
        graph is being captured and no joined copy exists yet: building one there would capture the copy."""
        weights = [self.codec_embedding.weight, *(table.weight for table in self.codebook_embedding)]
        key = tuple((weight.data_ptr(), None if weight.is_inference() else weight._version) for weight in weights)
        joined = getattr(self, "_joined", None)
        if joined is not None and joined[0] == key:
            return joined[1], joined[2]
        if weights[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        with torch.no_grad():
            table = torch.cat([weight.detach() for weight in weights])
            starts = torch.tensor([0, *itertools.accumulate(w.shape[0] for w in weights[:-1])], device=table.device)
        self._joined = (key, table, starts)
        return table, starts

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
