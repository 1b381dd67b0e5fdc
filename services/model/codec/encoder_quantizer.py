"""Quantizing encoder frames to codes: a split residual VQ, nearest codebook entry by Euclidean distance.

The semantic quantizer (codebook 0) and the acoustic one (codebooks 1..) each project the SAME frames to the VQ
width and quantize them residually: entry k of layer j is chosen for the residual left by layers < j. Only the
first `valid_num_quantizers` codebooks are computed; later acoustic layers cannot change earlier choices.
Buffer names follow the checkpoint (`layers.N.codebook.{initialized,cluster_usage,embed_sum}`).
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.codec.encoder_config import CodecEncoderConfig

_USAGE_FLOOR = 1e-5


class Codebook(nn.Module):
    """Entries are running sums over their usage counts (`embed_sum / cluster_usage`), as trained."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))
        self.register_buffer("fixed_entries", None, persistent=False)
        """`entries()` computed once by `fix()` (moved with the module, never saved), or None: computed each call."""

    def entries(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=_USAGE_FLOOR)[:, None]

    def fix(self) -> None:
        """Keep the entries computed now, once the checkpoint's sums and counts are in: a reference's encode then
        spends no launches on them (a clamp and a division a codebook, for each of the 16)."""
        self.fixed_entries = self.entries()

    def nearest(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For rows x [N, dim]: the index [N] of each one's nearest entry, and that entry [N, dim]."""
        entries = self.fixed_entries if self.fixed_entries is not None else self.entries()
        # cdist in float32 whatever the weights' dtype: bfloat16 distances would tie too often.
        index = torch.cdist(x[None].float(), entries[None].float())[0].argmin(dim=-1)
        return index, entries[index]


class ResidualQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, num_layers: int) -> None:
        super().__init__()
        dim, hidden = cfg.vector_quantization_hidden_dimension, cfg.hidden_size
        self.layers = nn.ModuleList(_Layer(cfg.codebook_size, dim) for _ in range(num_layers))
        self.input_proj = nn.Conv1d(hidden, dim, 1, bias=False) if dim != hidden else None
        self.output_proj = nn.Conv1d(dim, hidden, 1, bias=False) if dim != hidden else None
        """Decoding's projection back; unused when encoding, but part of the checkpoint."""

    def encode(self, frames: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """frames [B, hidden, T] -> codes [B, num_codebooks, T]."""
        x = self.input_proj(frames) if self.input_proj is not None else frames
        batch, dim, length = x.shape
        residual = x.transpose(1, 2).reshape(-1, dim)
        codes = []
        for layer in self.layers[:num_codebooks]:
            index, entry = layer.codebook.nearest(residual)
            residual = residual - entry
            codes.append(index.view(batch, length))
        return torch.stack(codes, dim=1)


class _Layer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class SplitQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        semantic = cfg.num_semantic_quantizers
        self.num_semantic = semantic
        self.semantic_residual_vector_quantizer = ResidualQuantizer(cfg, semantic)
        self.acoustic_residual_vector_quantizer = ResidualQuantizer(cfg, cfg.num_quantizers - semantic)

    def encode(self, frames: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """frames [B, hidden, T] -> codes [B, num_codebooks, T] (semantic first)."""
        semantic = self.semantic_residual_vector_quantizer.encode(frames, self.num_semantic)
        acoustic = self.acoustic_residual_vector_quantizer.encode(frames, num_codebooks - self.num_semantic)
        return torch.cat((semantic, acoustic), dim=1)


def fix_codebooks(module: nn.Module) -> None:
    """`Codebook.fix()` for every codebook in `module`: after its checkpoint is loaded and it is on its device."""
    for part in module.modules():
        if isinstance(part, Codebook):
            part.fix()
