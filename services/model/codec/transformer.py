"""The codec's pre-transformer: causal sliding-window attention over frames, streamed.

Each frame attends to itself and the `sliding_window - 1` frames before it. A stream keeps,
per layer, the rotated keys and the values of those previous frames, so a chunk's attention
costs O(chunk * window) whatever the stream's length. Names mirror the checkpoint
(`layers.N.self_attn.q_proj`, `layers.N.mlp_layer_scale.scale`, ...).

A codec pass for a few frames is bound by its launches, not its arithmetic, and these eight layers would launch most
of them. So, once `fuse_projections` has run (the loader runs it), q/k/v and gate/up are one GEMM each, q and k are rotated together, a layer scale and its residual
add are one `addcmul`, and on CUDA each norm and the silu product are one Triton kernel (the talker's `RMSNorm` and
`MLP`, whose numerics are the reference codec's too): ~25 launches fewer a layer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from services.model.codec.config import CodecConfig
from services.model.codec.stream_state import StreamRows
from services.model.layers import MLP, RMSNorm, apply_rope, fused_linear_weights, serves


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape [B, 1, n, head_dim] for absolute positions [B, n] (computed in float32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles = positions.float()[..., None] * inv_freq  # [B, n, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class SlidingWindowAttention(nn.Module):
    def __init__(self, config: CodecConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        inner, kv_inner, bias = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_inner, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_inner, bias=bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=bias)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None
        """q, k and v as one weight and bias (`fuse_projections`), or None: three GEMMs."""

    def fuse_projections(self) -> None:
        self.qkv = fused_linear_weights((self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x, cos, sin, mask, stream: StreamRows) -> torch.Tensor:
        """x [B, n, hidden]; cos, sin [B, 1, n, head_dim]; mask [B, 1, n, window + n] bool (True = may attend)."""
        batch, num_new, _ = x.shape
        if self.qkv is not None and serves(self.qkv[0], x):
            heads = self.num_heads + 2 * self.num_kv_heads
            qkv = F.linear(x, *self.qkv).view(batch, num_new, heads, self.head_dim)
            rotated = apply_rope(qkv[:, :, :self.num_heads + self.num_kv_heads], cos.transpose(1, 2), sin.transpose(1, 2))
            q = rotated[:, :, :self.num_heads].transpose(1, 2)
            k = rotated[:, :, self.num_heads:].transpose(1, 2)
            v = qkv[:, :, self.num_heads + self.num_kv_heads:].transpose(1, 2)
        else:
            q = self.q_proj(x).view(batch, num_new, self.num_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(batch, num_new, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(batch, num_new, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys = torch.cat([stream.keys[self.layer_index], k], dim=2)
        values = torch.cat([stream.values[self.layer_index], v], dim=2)
        window = stream.keys[self.layer_index].shape[2]
        stream.keep_window(self.layer_index, keys, values, window)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, num_new, -1))


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecConfig, layer_index: int) -> None:
        super().__init__()
        dim, eps, initial = config.hidden_size, config.rms_norm_eps, config.layer_scale_initial_scale
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = SlidingWindowAttention(config, layer_index)
        self.self_attn_layer_scale = LayerScale(dim, initial)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, config.intermediate_size, "silu")
        self.mlp_layer_scale = LayerScale(dim, initial)

    def forward(self, x, cos, sin, mask, stream: StreamRows) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, mask, stream)
        x = torch.addcmul(x, self.self_attn_layer_scale.scale, attended)  # x + scale * attended, one launch
        return torch.addcmul(x, self.mlp_layer_scale.scale, self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """[B, n, latent_dim] -> [B, n, latent_dim], attending over the stream's recent frames."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        self.config = config
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)

    def fuse_projections(self) -> None:
        """Compute each layer's q/k/v and gate/up with one GEMM from now on (after the weights are loaded and moved:
        the parameters become views of the fused weights, so the state dict keeps its names and values)."""
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def forward(self, x: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        num_new = x.shape[1]
        positions = stream.positions[:, None] + torch.arange(num_new, device=x.device)  # [B, n]
        mask = self._attention_mask(stream.positions, num_new)
        hidden = self.input_proj(x)
        cos, sin = rotary_tables(positions, self.config.head_dim, self.config.rope_theta, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, mask, stream)
        return self.output_proj(self.norm(hidden))

    def _attention_mask(self, starts: torch.Tensor, num_new: int) -> torch.Tensor:
        """[B, 1, n, window + n]: key j is visible to query i if it is not in the future, not
        older than the sliding window, and not a not-yet-filled slot before the stream start."""
        window = self.config.sliding_window - 1
        offsets = torch.arange(-window, num_new, device=starts.device)
        key_pos = starts[:, None] + offsets  # [B, window + n]
        query_pos = starts[:, None] + torch.arange(num_new, device=starts.device)  # [B, n]
        key_pos, query_pos = key_pos[:, None, :], query_pos[:, :, None]
        visible = (key_pos <= query_pos) & (key_pos > query_pos - self.config.sliding_window) & (key_pos >= 0)
        return visible[:, None]
