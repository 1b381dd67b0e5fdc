"""Qwen3-style decoder layers shared by the talker and the code predictor.

The layers never own a KV cache: attention is delegated to an `Attend` callable given per forward, so the
talker reads and writes the engine's paged pool while the code predictor uses a small dense cache.
Parameter names match the checkpoint's (`self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`, ...).
Numerics follow the reference where they differ from the obvious: RMSNorm normalises in float32 and
casts back before the weight multiply; RoPE tables are computed in float32 and cast to the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from services.kernels import fused_norm_rope, fused_qk_norm_rope, fused_rms_norm, fused_silu_mul, skinny_linear
from services.kernels.fused_qk_norm_rope import KvDestination
from services.kernels.fused_small_attention import HeadNorms
from services.kernels.skinny_linear import SplitSum
from services.kernels.triton_support import compiles_for
from services.model.config import DecoderConfig

_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class Attend(Protocol):
    """Attention for one layer: q [..., Hq, D], k and v [..., Hkv, D] (normed, rotated) -> [..., Hq, D]."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class AttendsFromPool(Attend, Protocol):
    """An `Attend` that may let the layer's fused q/k norm + RoPE kernel store k and v in its KV pool itself (one
    launch instead of the kernel's k output and a separate write); the layer then hands it q alone. Optional: the
    layer looks for `kv_destination` by name (an isinstance check on a protocol looks up each of its members, host time
    that an eager step's saved launch would not repay)."""

    def kv_destination(self, layer: int) -> KvDestination | None:
        """Where this layer's new k and v go, for the fused kernel to write (then `attend_stored`); None: call the
        attend with k and v as usual (its attention kernel does not run where the fused one does)."""
        ...

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention for q [T, Hq, D] once the layer's new k and v are at `kv_destination(layer)`."""
        ...


class AttendsProjected(Attend, Protocol):
    """An `Attend` whose attention kernel may take the fused q/k/v projection's output and norm and rotate q and k
    itself (the code predictor's dense cache: one launch a layer instead of two). Optional, looked up by name like
    `kv_destination`."""

    def attend_projected(self, layer: int, qkv: torch.Tensor, num_heads: int, norms: HeadNorms) -> torch.Tensor | None:
        """Attention [..., Hq, D] from qkv [B, n, width]; None where the kernel does not serve (then the layer norms and
        rotates q and k and calls the attend as usual)."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if compiles_for(x.device) and self.weight.dtype == x.dtype:
            return fused_rms_norm.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rope:
    """Plain 1-D rotary embedding over the whole head dimension.

    The inverse frequencies are computed once on the CPU, as the reference does, and copied to each device
    on first use; they are no module buffer, so a dtype conversion of the weights never touches them.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        self._inv_freq = {torch.device("cpu"): 1.0 / (theta**exponents)}

    def inputs(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeInputs:
        """What the attention layers rotate with: the positions and frequencies where the fused norm + RoPE kernel
        runs (it makes its own angles), else the cos/sin tables."""
        if compiles_for(positions.device) and positions.dim() == 1:
            return FusedRope(positions, self.inv_freq(positions.device))
        return self.tables(positions, dtype)

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        inv_freq = self._inv_freq.get(device)
        if inv_freq is None:
            inv_freq = self._inv_freq[device] = self._inv_freq[torch.device("cpu")].to(device)
        return inv_freq

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape [*positions.shape, 1, head_dim], ready to broadcast over heads."""
        return self.tables_of(positions, self.inv_freq(positions.device), dtype)

    @staticmethod
    def tables_of(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[..., None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)


@dataclass(frozen=True, slots=True)
class FusedRope:
    """RoPE inputs of the fused kernel: positions [P] (of the token axis) and the inverse frequencies."""

    positions: torch.Tensor
    inv_freq: torch.Tensor


RopeInputs = FusedRope | tuple[torch.Tensor, torch.Tensor]
"""What one forward's layers rotate with: `FusedRope`, or the (cos, sin) tables of the torch form."""


def norm_and_rotate(norm: RMSNorm, x: torch.Tensor, rope: RopeInputs) -> torch.Tensor:
    """`apply_rope(norm(x), cos, sin)` for heads x [..., P, heads, D]: one fused launch where it runs."""
    if isinstance(rope, FusedRope) and norm.weight.dtype == x.dtype:
        return fused_norm_rope.norm_rope(x, norm.weight, norm.eps, rope.positions, rope.inv_freq)
    if isinstance(rope, FusedRope):  # a weight in another dtype than the activations: the torch form
        rope = Rope.tables_of(rope.positions, rope.inv_freq, x.dtype)
    cos, sin = rope
    return apply_rope(norm(x), cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def serves(fused: torch.Tensor | None, x: torch.Tensor) -> bool:
    """Whether a fused weight exists and lies where x does (a module moved after fusing uses its own weights)."""
    return fused is not None and fused.device == x.device and fused.dtype == x.dtype


def fused_linear_weights(projections: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input; each projection's parameters become views
    of it, so the memory is not doubled and the state dict keeps its names and values."""
    weight = torch.cat([p.weight for p in projections])
    has_bias = projections[0].bias is not None
    bias = torch.cat([p.bias for p in projections]) if has_bias else None
    widths = [p.out_features for p in projections]
    for index, (p, part) in enumerate(zip(projections, weight.split(widths))):
        p.weight = nn.Parameter(part, requires_grad=False)
        if bias is not None:
            p.bias = nn.Parameter(bias.split(widths)[index], requires_grad=False)
    return weight, bias


class SelfAttention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_width, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_width, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_width, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_width, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.head_dim = cfg.head_dim
        self.widths = (q_width, kv_width, kv_width)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None
        """The fused q/k/v weight and bias (`fuse_projections`), or None: three GEMMs."""

    def fuse_projections(self) -> None:
        """Compute q, k and v with one GEMM from now on (two launches fewer a layer)."""
        self.qkv = fused_linear_weights((self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x: torch.Tensor, rope: RopeInputs, layer: int, attend: Attend,
                deferred: bool = False) -> torch.Tensor | SplitSum:
        """The attention's output; with `deferred`, o_proj's partial sums where the split kernel serves it (see
        `skinny_linear.deferred_linear`: only a norm that adds them may read them)."""
        if self.takes_projection(x, rope):
            return self.from_projection(F.linear(x, *self.qkv), rope, layer, attend, deferred)
        out = self._attend_unfused(x, rope, layer, attend)
        return self._output(out.reshape(*x.shape[:-1], -1), deferred)

    def takes_projection(self, x: torch.Tensor, rope: RopeInputs) -> bool:
        """Whether `from_projection` serves rows like `x`: fused weights, the fused RoPE, norms in x's dtype."""
        return self.qkv is not None and isinstance(rope, FusedRope) and self._norm_weights_in(x.dtype)

    def from_projection(self, qkv: torch.Tensor, rope: FusedRope, layer: int, attend: Attend,
                        deferred: bool = False) -> torch.Tensor | SplitSum:
        """The attention's output (o_proj applied) from the fused q/k/v projection's output qkv [..., width]."""
        out = self._attend_fused(qkv, rope, layer, attend)
        return self._output(out.reshape(*qkv.shape[:-1], -1), deferred)

    def _output(self, heads: torch.Tensor, deferred: bool) -> torch.Tensor | SplitSum:
        if deferred:
            return skinny_linear.deferred_linear(heads, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(heads)

    def _norm_weights_in(self, dtype: torch.dtype) -> bool:
        return self.q_norm.weight.dtype == dtype and self.k_norm.weight.dtype == dtype

    def _attend_unfused(self, x: torch.Tensor, rope: RopeInputs, layer: int, attend: Attend) -> torch.Tensor:
        """q and k normed and rotated one after the other (the torch form, or one `norm_rope` launch each)."""
        heads = (*x.shape[:-1], -1, self.head_dim)
        if self.qkv is not None:
            q, k, v = F.linear(x, *self.qkv).split(self.widths, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = norm_and_rotate(self.q_norm, q.view(heads), rope)
        k = norm_and_rotate(self.k_norm, k.view(heads), rope)
        return attend(layer, q, k, v.view(heads))

    def _attend_fused(self, qkv: torch.Tensor, rope: FusedRope, layer: int, attend: Attend) -> torch.Tensor:
        """q and k normed and rotated in one launch (`fused_qk_norm_rope.py`), which also stores k and v where the
        attend offers its pool; else the attend gets k and v as usual."""
        norms = ((self.q_norm.weight, self.q_norm.eps), (self.k_norm.weight, self.k_norm.eps))
        num_heads = self.widths[0] // self.head_dim
        attend_projected = getattr(attend, "attend_projected", None)  # see `AttendsProjected`
        if attend_projected is not None and qkv.dim() == 3:
            out = attend_projected(layer, qkv, num_heads, HeadNorms(*norms, rope.positions, rope.inv_freq))
            if out is not None:
                return out
        kv_destination = getattr(attend, "kv_destination", None)  # see `AttendsFromPool`
        destination = kv_destination(layer) if kv_destination is not None else None
        if destination is not None:
            q = fused_qk_norm_rope.qk_norm_rope_into_pool(qkv, *norms, rope.positions, rope.inv_freq, num_heads,
                                                          self.head_dim, destination)
            return attend.attend_stored(layer, q)
        q, k = fused_qk_norm_rope.qk_norm_rope(qkv, *norms, rope.positions, rope.inv_freq, num_heads, self.head_dim)
        v = qkv[..., self.widths[0] + self.widths[1]:]
        return attend(layer, q, k, v.view(*v.shape[:-1], -1, self.head_dim))


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)): the talker's, the code predictor's and the codec transformer's."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = _ACTIVATIONS[hidden_act]
        self.gate_up: torch.Tensor | None = None
        """The fused gate/up weight (`fuse_projections`), or None: two GEMMs."""
        self.gated_gemm = False
        """Whether the projection and the activation may run as one kernel (`skinny_linear.gated_silu`), as
        `fuse_projections` was told."""

    def fuse_projections(self, gated_gemm: bool = True) -> None:
        """Compute gate and up with one GEMM from now on (and, for silu on CUDA, the activation and product with one
        kernel): three launches fewer a layer. `gated_gemm`: where it fits, the GEMM and the activation as one
        kernel (the `gated_gemm` setting)."""
        self.gate_up = fused_linear_weights((self.gate_proj, self.up_proj))[0]
        self.gated_gemm = gated_gemm

    def forward(self, x: torch.Tensor, deferred: bool = False) -> torch.Tensor | SplitSum:
        """With `deferred`, down_proj's partial sums where the split kernel serves it (as `SelfAttention.forward`)."""
        if not serves(self.gate_up, x):
            activated = self.act(self.gate_proj(x)) * self.up_proj(x)
        elif deferred and self.gated_gemm and self.act is F.silu and skinny_linear.serves_gated(x, self.gate_up):
            activated = skinny_linear.gated_silu(x, self.gate_up)  # the projection and the activation in one launch
        else:
            gate_up = F.linear(x, self.gate_up)
            if self.act is F.silu and compiles_for(x.device):
                activated = fused_silu_mul.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                activated = self.act(gate) * up
        if deferred:
            return skinny_linear.deferred_linear(activated, self.down_proj.weight, self.down_proj.bias)
        return self.down_proj(activated)


def fuse_projections(module: nn.Module, gated_gemm: bool = True) -> None:
    """Fuse the projections of every attention and MLP inside `module` that read the same input (see each);
    `gated_gemm` goes to each MLP's."""
    for part in module.modules():
        if isinstance(part, SelfAttention):
            part.fuse_projections()
        elif isinstance(part, MLP):
            part.fuse_projections(gated_gemm)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RopeInputs, layer: int, attend: Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, layer, attend)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_deferred(self, x: torch.Tensor, pending: torch.Tensor | None, rope: RopeInputs, layer: int,
                         attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` with each residual add done by the norm that reads its result (one fused launch): takes the
        residual stream x and the previous layer's MLP output not yet added (`pending`, None for the first layer);
        returns this layer's (stream, MLP output to add)."""
        first, second = self.input_layernorm, self.post_attention_layernorm
        if pending is None:
            normed = first(x)
        else:
            x, normed = fused_rms_norm.add_rms_norm(x, pending, first.weight, first.eps)
        attended = self.self_attn(normed, rope, layer, attend, deferred=True)
        # o_proj's and down_proj's outputs go only to the norm after them: their partial sums do (`skinny_linear`)
        x, normed = fused_rms_norm.add_rms_norm(x, attended, second.weight, second.eps)
        return x, self.mlp(normed, deferred=True)


class DecoderStack(nn.Module):
    """Layers, final norm and RoPE: embeddings in, final-normed hidden states out."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x [..., T, hidden] with positions [T] (or broadcastable to x's leading dims)."""
        rope = self.rope.inputs(positions, x.dtype)
        if compiles_for(x.device) and self.norm.weight.dtype == x.dtype:
            pending = None  # residual adds fused into the norms that follow them (a config has at least one layer)
            for index, layer in enumerate(self.layers):
                x, pending = layer.forward_deferred(x, pending, rope, index, attend)
            return fused_rms_norm.add_rms_norm(x, pending, self.norm.weight, self.norm.eps)[1]
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, index, attend)
        return self.norm(x)


class TextProjection(nn.Module):
    """`text_projection`: Linear(bias) -> activation -> Linear(bias), text width to talker width."""

    def __init__(self, text_hidden: int, out_hidden: int, act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, out_hidden, bias=True)
        self.act = _ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))
