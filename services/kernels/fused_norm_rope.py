"""Per-head RMSNorm then rotary embedding (the attention's q_norm/k_norm + RoPE) as one Triton kernel on CUDA.

The torch form is a norm (one launch when fused, eight otherwise) and a rotation of five launches, for q and for
k, in every layer, plus the cos/sin tables of every forward: a quarter of the code predictor's launches. Here one
launch reads each head once and writes it once. The numerics follow the torch form step by step (float32
statistics and angles; the norm's output, cos, sin and each product rounded to the model dtype as torch rounds
them), so the results match it to the last bit or so. Off CUDA the torch form serves; the CPU tests check this
kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.triton_support import tl, triton


if triton is not None:
    from services.kernels.fused_qk_norm_rope import norm_rope_head

    @triton.jit
    def _norm_rope_kernel(x_ptr, weight_ptr, positions_ptr, inv_freq_ptr, out_ptr, stride_token, stride_head,
                          stride_out, stride_position, num_positions, eps, HEAD_DIM: tl.constexpr,
                          HALF: tl.constexpr):
        token = tl.program_id(0)
        head = tl.program_id(1)
        base = x_ptr + token * stride_token + head * stride_head
        position = tl.load(positions_ptr + (token % num_positions) * stride_position).to(tl.float32)
        out = norm_rope_head(base, weight_ptr, eps, position, inv_freq_ptr, out_ptr, HEAD_DIM, HALF)
        tl.store(out_ptr + token * stride_out + head * HEAD_DIM + tl.arange(0, HEAD_DIM), out)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor,
              inv_freq: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the head dimension then RoPE, for x [..., P, heads, D] whose position along P is `positions`
    [P] (leading dimensions repeat them, as the code predictor's rows do). Returns a new contiguous tensor. x may
    be a column slice of a wider tensor (the fused q/k/v projection's output): only its heads must be dense."""
    *lead, heads, head_dim = x.shape
    if positions.dim() != 1 or not lead or lead[-1] != positions.shape[0]:
        raise ValueError(f"norm_rope needs positions [P] for x [..., P, heads, D], got {tuple(positions.shape)} and "
                         f"{tuple(x.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"norm_rope needs the weight in the input's dtype, got {weight.dtype} and {x.dtype}")
    flat = x.reshape(-1, heads, head_dim)
    if flat.stride(2) != 1 or flat.stride(1) != head_dim:
        flat = flat.contiguous()
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    _norm_rope_kernel[(flat.shape[0], heads)](
        flat, weight, positions, inv_freq, out, flat.stride(0), flat.stride(1), out.stride(0), positions.stride(0),
        positions.shape[0], eps,
        HEAD_DIM=head_dim, HALF=head_dim // 2)
    return out.view(x.shape)
