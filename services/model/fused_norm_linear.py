"""A layer's residual add, RMSNorm and the projection that reads the normed rows, in one Triton kernel on CUDA; for
the SwiGLU MLP also its activation and product.

In a decode step every layer runs add+norm -> q/k/v GEMM and add+norm -> gate/up GEMM -> silu*up: five launches for
two weight reads. At the batches a decode step has (at most a few dozen rows) the GEMMs stream their weights and the
launches in between are pure overhead (the code predictor runs 75 layers a frame). Here one program owns a block of
output columns for every row: it reads the rows once, adds the residual (storing the sum, the stream the next layer
reads, from the programs of the first column block), and multiplies them, scaled by the norm's weight, into its
columns while it sums their squares; the row's 1/rms scales the result at the end (the norm is linear in the
scale, so this is the same product, rounded once where the reference rounds the normed row first: a difference of
the order of one bf16 rounding, which the GPU tests bound). With `gated` the weight holds gate rows then up rows and
the program keeps both sums, writing `silu(gate) * up` rounded as torch rounds each step.

Serves bf16 and fp16 on CUDA for up to `MAX_ROWS` rows (larger steps, prefills, stay with the GEMM library, where
tiles over rows pay); off CUDA the torch form in `layers.py` is the path, and the CPU tests check this kernel under
Triton's interpreter.

Off by default: on the H200 (2026-12-03, 85d84b7, loadtest/RESULTS-GPU.md) it is correct but slower than the GEMM
library's kernels plus the launches it removes: the sampling graph at batch 64 took 5.57 ms against 3.65, the talker
graph 1.99 against 1.30, with 225 and 84 launches fewer. Its blocks (32 output columns, 128 input columns, 4 warps, 3
stages) stream the weights at about a quarter of the library's rate (23 us a launch at batch 64).
`VOXMESH_FUSED_NORM_LINEAR=1` turns it on for the tuning runs (loadtest/gpu/fused_norm_linear_sweep.py,
loadtest/gpu/fused_norm_linear_ab.sh) that would have to win that back first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from services.model.triton_support import tl, triton

MAX_ROWS = 128
"""Rows of the largest call served: one block of rows per program (a decode step's batch, or the code predictor's
first pass of two rows a request)."""


@dataclass(frozen=True, slots=True)
class Blocks:
    """How the work is cut: output columns a program computes (`block_n`: small enough that a 4096-wide projection
    spreads over ~100 programs), input columns it reads at a time (`block_k`, halved for 128-row calls so the rows
    fit in registers), and Triton's warps and pipeline stages. loadtest/gpu/fused_norm_linear_sweep.py times the
    choices on the card."""

    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_BLOCKS = Blocks()

ENABLED = os.environ.get("VOXMESH_FUSED_NORM_LINEAR", "0") == "1"
"""Whether the layers take the kernel (see above: off unless asked for)."""

if triton is not None:

    @triton.jit
    def _add_norm_linear_kernel(x_ptr, delta_ptr, norm_ptr, weight_ptr, total_ptr, out_ptr,
                                num_rows, num_out, up_offset, eps,
                                stride_x, stride_delta, stride_weight, stride_total, stride_out,
                                NUM_COLS: tl.constexpr, HAS_DELTA: tl.constexpr, GATED: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        block_n = tl.program_id(0)
        rows = tl.arange(0, BLOCK_M)
        outs = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_in, out_in = rows < num_rows, outs < num_out
        dtype = out_ptr.dtype.element_ty
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, NUM_COLS, BLOCK_K):  # the width a constant: one compilation a model's width
            cols = start + tl.arange(0, BLOCK_K)
            col_in = cols < NUM_COLS
            inside = row_in[:, None] & col_in[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=inside, other=0.0)
            if HAS_DELTA:
                delta = tl.load(delta_ptr + rows[:, None] * stride_delta + cols[None, :], mask=inside, other=0.0)
                x = (x.to(tl.float32) + delta.to(tl.float32)).to(dtype)  # the residual stream, rounded as torch's add
                tl.store(total_ptr + rows[:, None] * stride_total + cols[None, :], x, mask=inside & (block_n == 0))
            x = x.to(tl.float32)
            sum_sq += tl.sum(x * x, axis=1)
            scale = tl.load(norm_ptr + cols, mask=col_in, other=0.0).to(tl.float32)
            scaled = (x * scale[None, :]).to(dtype)
            w_inside = out_in[:, None] & col_in[None, :]
            weight = tl.load(weight_ptr + outs[:, None] * stride_weight + cols[None, :], mask=w_inside, other=0.0)
            acc = tl.dot(scaled, tl.trans(weight), acc)
            if GATED:
                up = tl.load(weight_ptr + (up_offset + outs)[:, None] * stride_weight + cols[None, :], mask=w_inside,
                             other=0.0)
                acc_up = tl.dot(scaled, tl.trans(up), acc_up)
        inv_rms = tl.rsqrt(sum_sq / NUM_COLS + eps)[:, None]
        result = acc * inv_rms
        if GATED:
            gate = result.to(dtype).to(tl.float32)
            up_rows = (acc_up * inv_rms).to(dtype).to(tl.float32)
            result = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up_rows
        tl.store(out_ptr + rows[:, None] * stride_out + outs[None, :], result.to(dtype),
                 mask=row_in[:, None] & out_in[None, :])


def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes rows `x` [..., K] and a projection weight [N, K] (CUDA, bf16/fp16, few rows)."""
    return (ENABLED and triton is not None and x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.stride(-1) == 1 and x.numel() // x.shape[-1] <= MAX_ROWS)


def add_norm_linear(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, *, gated: bool = False,
                    blocks: Blocks = DEFAULT_BLOCKS) -> tuple[torch.Tensor, torch.Tensor]:
    """`total = x + delta` (x itself when `delta` is None) and `linear(rms_norm(total), weight)` in one launch; with
    `gated`, `weight` is [2I, K] (gate rows, then up rows) and the output is `silu(gate) * up` [..., I].
    Returns (total, out)."""
    num_cols = x.shape[-1]
    if weight.shape[-1] != num_cols or norm_weight.shape != (num_cols,) or norm_weight.dtype != x.dtype:
        raise ValueError(f"add_norm_linear: rows {tuple(x.shape)}, norm weight {tuple(norm_weight.shape)} "
                         f"{norm_weight.dtype} and weight {tuple(weight.shape)} do not fit together")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(f"add_norm_linear: delta {tuple(delta.shape)} {delta.dtype} is not like x "
                         f"{tuple(x.shape)} {x.dtype}")
    rows = _rows(x)
    num_rows = rows.shape[0]
    if num_rows > MAX_ROWS:
        raise ValueError(f"add_norm_linear serves at most {MAX_ROWS} rows, got {num_rows}")
    num_out = weight.shape[0] // 2 if gated else weight.shape[0]
    deltas = _rows(delta) if delta is not None else rows
    total = torch.empty_like(rows) if delta is not None else rows
    out = torch.empty((num_rows, num_out), dtype=x.dtype, device=x.device)
    block_m = max(16, triton.next_power_of_2(num_rows))  # tl.dot's smallest tile
    if num_rows:
        _add_norm_linear_kernel[(triton.cdiv(num_out, blocks.block_n),)](
            rows, deltas, norm_weight, weight, total, out, num_rows, num_out, num_out if gated else 0, eps,
            rows.stride(0), deltas.stride(0), weight.stride(0), total.stride(0), out.stride(0), NUM_COLS=num_cols,
            HAS_DELTA=delta is not None, GATED=gated, BLOCK_M=block_m, BLOCK_N=blocks.block_n,
            BLOCK_K=blocks.block_k if block_m <= 64 else max(16, blocks.block_k // 2),
            num_warps=blocks.num_warps, num_stages=blocks.num_stages)
    return total.view(x.shape), out.view(*x.shape[:-1], num_out)


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()
