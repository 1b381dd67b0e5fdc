"""Codes -> latent vectors: the split residual vector quantizer's decode half.

Codebook 0 (semantic) and codebooks 1..Q-1 (acoustic) are looked up, summed within their
group, and each group is projected to `codebook_dim` by its own 1x1 convolution. Module and
buffer names mirror the checkpoint (`rvq_first.vq.layers.0._codebook.embedding_sum`, ...).
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.codec.config import CodecConfig

# The reference divides by the usage count clamped at this value.
_USAGE_EPSILON = 1e-5


class Codebook(nn.Module):
    """One codebook, stored as the checkpoint stores it: running sums and usage counts."""

    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(codebook_size))
        self.register_buffer("embedding_sum", torch.zeros(codebook_size, dim))

    def vectors(self) -> torch.Tensor:
        """[codebook_size, dim] float32 codebook vectors: sum / clamped usage."""
        usage = self.cluster_usage.float().clamp(min=_USAGE_EPSILON)
        return self.embedding_sum.float() / usage[:, None]


class _QuantizerLayer(nn.Module):
    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(codebook_size, dim)


class CodebookGroup(nn.Module):
    """A group of codebooks whose vectors are summed, then projected by `output_proj`."""

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(_QuantizerLayer(codebook_size, dim) for _ in range(num_codebooks))
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def codebooks(self) -> list[Codebook]:
        return [layer._codebook for layer in self.vq.layers]


class SplitQuantizerDecoder(nn.Module):
    """[B, n, Q] codes -> [B, codebook_dim, n] latents."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        num_semantic = config.num_semantic_quantizers
        dim, size = config.codebook_entry_dim, config.codebook_size
        self.codebook_size = size
        self.rvq_first = CodebookGroup(num_semantic, size, dim, config.codebook_dim)
        self.rvq_rest = CodebookGroup(config.num_quantizers - num_semantic, size, dim, config.codebook_dim)
        self.num_semantic = num_semantic
        # Derived from the buffers by refresh_table(); not part of the checkpoint.
        self.register_buffer("table", torch.zeros(config.num_quantizers * size, dim), persistent=False)

    @torch.no_grad()
    def refresh_table(self) -> None:
        """Recompute the flat lookup table after the codebook buffers were loaded or changed."""
        books = self.rvq_first.codebooks() + self.rvq_rest.codebooks()
        table = torch.cat([book.vectors() for book in books])
        self.table = table.to(device=self.table.device, dtype=self.table.dtype)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        num_codebooks = codes.shape[-1]
        offsets = torch.arange(num_codebooks, device=codes.device) * self.codebook_size
        vectors = nn.functional.embedding(codes + offsets, self.table)  # [B, n, Q, dim]
        semantic = vectors[:, :, : self.num_semantic].sum(dim=2).transpose(1, 2)
        acoustic = vectors[:, :, self.num_semantic :].sum(dim=2).transpose(1, 2)
        return self.rvq_first.output_proj(semantic) + self.rvq_rest.output_proj(acoustic)
