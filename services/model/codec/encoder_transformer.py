"""The codec encoder's transformer over 25 Hz frames: pre-LayerNorm, causal attention with rotary positions,
a GELU MLP, layer scales on both residual branches, no final norm.

Attention reaches back over the whole input, as the reference computes it on the CPU (its configured sliding
window of 250 frames is not applied there); a reference clip of 30 s is 750 frames.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from services.model.codec.encoder_config import CodecEncoderConfig
from services.model.codec.transformer import LayerScale, rotary_tables


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class EncoderAttention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_dim, kv_dim, bias = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, frames, _ = x.shape
        q = self.q_proj(x).view(batch, frames, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        repeat = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, frames, -1))


class EncoderMlp(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = EncoderAttention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, 0.01)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = EncoderMlp(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, 0.01)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, frames, hidden] -> [B, frames, hidden]."""
        positions = torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = rotary_tables(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x
