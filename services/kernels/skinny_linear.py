"""`x @ w.T` for a few rows (a decode step's, <= 64) in Triton: fewer launches for the projections of a step.

At 64 rows a projection reads its weight once and does little arithmetic with it: its time is a fixed cost (launch,
ramp and tail) plus its weight's bytes at the card's rate, whichever library runs it, and cuBLAS runs the narrow
outputs (o_proj and down_proj: too few tiles to occupy the device) split, with a reduce launch of its own. What a
step can save is launches.

Here a program owns `BLOCK_N` output columns of all rows and a slice of the reduction; with `split_k` > 1 the
slices' float32 partial sums go to a workspace [split_k, rows, N] and a second launch adds them and rounds to the
output dtype. A layer's o_proj and down_proj skip that launch: their output is only ever added to the residual stream
by the norm that follows (`DecoderLayer.forward_deferred`), so `deferred_linear` hands that norm the partial sums
(`SplitSum`) and it adds them itself (`fused_rms_norm.add_rms_norm`). `gated_silu` is the MLP's gate/up projection
with `silu(gate) * up` in its epilogue (the `gated_gemm` setting chooses it). Off CUDA
the torch form serves; the CPU tests check the kernels under Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.kernels.triton_support import compiles_for, tl, triton


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    """One launch shape: columns a program owns, the reduction's step, how many slices it is split into."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


if triton is not None:

    @triton.jit
    def _skinny_linear_kernel(x_ptr, w_ptr, out_ptr, rows, stride_x, stride_w, stride_out, stride_split,
                              K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr):
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(1)
        row = tl.arange(0, BLOCK_M)
        row_inside = row < rows
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        start = split * K_PER_SPLIT
        for k in tl.range(0, K_PER_SPLIT, BLOCK_K):
            depth = start + k + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + row[:, None] * stride_x + depth[None, :], mask=row_inside[:, None], other=0.0)
            w = tl.load(w_ptr + cols[:, None] * stride_w + depth[None, :])
            acc = tl.dot(x, tl.trans(w), acc)
        target = out_ptr + split * stride_split + row[:, None] * stride_out + cols[None, :]
        if PARTIAL:
            tl.store(target, acc, mask=row_inside[:, None])
        else:
            tl.store(target, acc.to(out_ptr.dtype.element_ty), mask=row_inside[:, None])

    @triton.jit
    def _gated_silu_kernel(x_ptr, w_ptr, out_ptr, rows, width, stride_x, stride_w, stride_out,
                           K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row = tl.arange(0, BLOCK_M)
        row_inside = row < rows
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K):
            depth = k + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + row[:, None] * stride_x + depth[None, :], mask=row_inside[:, None], other=0.0)
            gate_w = tl.load(w_ptr + cols[:, None] * stride_w + depth[None, :])
            up_w = tl.load(w_ptr + (width + cols)[:, None] * stride_w + depth[None, :])
            gate = tl.dot(x, tl.trans(gate_w), gate)
            up = tl.dot(x, tl.trans(up_w), up)
        dtype = out_ptr.dtype.element_ty
        # As `fused_silu_mul` on the GEMM's rounded output: gate and up rounded, the activation in float32 rounded,
        # the product in float32 rounded.
        gate = gate.to(dtype).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(out_ptr + row[:, None] * stride_out + cols[None, :], (activated * up).to(dtype),
                 mask=row_inside[:, None])

    @triton.jit
    def _sum_splits_kernel(partial_ptr, out_ptr, count, stride_split, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
        index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = index < count
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for split in tl.static_range(SPLITS):
            total += tl.load(partial_ptr + split * stride_split + index, mask=inside, other=0.0)
        tl.store(out_ptr + index, total.to(out_ptr.dtype.element_ty), mask=inside)


SUM_BLOCK = 1024
MAX_ROWS = 64
"""The most rows the kernels serve: a decode step's at the engine's usual 64 streams."""

DEFERRED = SkinnyConfig(block_n=32, block_k=128, split_k=4, num_warps=4, num_stages=4)
"""The launch of a deferred projection, chosen for the 0.6B talker's o_proj (1024 x 2048) and down_proj (1024 x 3072)
at 16 to 64 rows: narrow column blocks and a 4-way split of the reduction, so that enough programs run to occupy the
device."""
DEFERRED_MAX_OUT = 2048
"""Wider outputs have tiles enough to fill the device unsplit: cuBLAS serves them in one launch, as fast."""


@dataclass(frozen=True, slots=True)
class SplitSum:
    """A projection's output not yet summed: float32 partial sums [splits, rows, N] whose sum, rounded to the model's
    dtype, is `x @ weight.T` (rows flattened). Read only by `fused_rms_norm.add_rms_norm`."""

    partials: torch.Tensor
    shape: torch.Size
    """The projection's output shape (the input's leading dimensions, N)."""
    dtype: torch.dtype
    """The dtype the sum is rounded to."""


def fits(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig, max_rows: int = MAX_ROWS) -> bool:
    """Whether the kernel serves `x @ weight.T` with `config`: rows <= max_rows, whole tiles, rows contiguous."""
    out_features, in_features = weight.shape
    rows = x.numel() // max(in_features, 1)
    return (x.shape[-1] == in_features and 0 < rows <= max_rows and out_features % config.block_n == 0
            and in_features % (config.split_k * config.block_k) == 0 and weight.stride(-1) == 1
            and x.stride(-1) == 1 and x.dtype == weight.dtype)


def block_rows(rows: int) -> int:
    """The row tile: the rows rounded up to a power of two, at least 16 (the tensor cores' smallest)."""
    return max(16, triton.next_power_of_2(rows))


def serves(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `deferred_linear` splits this projection: on CUDA, no bias, at most `MAX_ROWS` rows and an output of
    at most `DEFERRED_MAX_OUT` columns (a test under the interpreter replaces this to take the kernel on the CPU)."""
    return (bias is None and compiles_for(x.device) and weight.shape[0] <= DEFERRED_MAX_OUT
            and fits(x, weight, DEFERRED))


def deferred_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | SplitSum:
    """`F.linear(x, weight, bias)`, or its partial sums (`SplitSum`) where the split kernel `serves` it."""
    if not serves(x, weight, bias):
        return F.linear(x, weight, bias)
    return partial_sums(x, weight, DEFERRED)


def partial_sums(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> SplitSum:
    """The kernel's float32 partial sums of `x @ weight.T`, one per slice of the reduction (the caller checked
    `fits`)."""
    out_features, in_features = weight.shape
    flat = x.reshape(-1, in_features)
    rows = flat.shape[0]
    partial = torch.empty((config.split_k, rows, out_features), dtype=torch.float32, device=x.device)
    _skinny_linear_kernel[(out_features // config.block_n, config.split_k)](
        flat, weight, partial, rows, flat.stride(0), weight.stride(0), partial.stride(1), partial.stride(0),
        K_PER_SPLIT=in_features // config.split_k, BLOCK_M=block_rows(rows), BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, PARTIAL=True, num_warps=config.num_warps, num_stages=config.num_stages)
    return SplitSum(partial, torch.Size((*x.shape[:-1], out_features)), x.dtype)


GATED = SkinnyConfig(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=4)
"""The gated launch: 32 columns of gate and 32 of up a program, 64 columns of the joined weight as the deferred
launch's programs read 32."""


def serves_gated(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """Whether `gated_silu` serves `silu(x @ gate.T) * (x @ up.T)` for the fused gate/up weight [2I, K]: on CUDA, at
    most `MAX_ROWS` rows, whole tiles (whether it may is the caller's choice: the `gated_gemm` setting)."""
    half = gate_up.shape[0] // 2
    return (compiles_for(x.device) and half % GATED.block_n == 0
            and fits(x, gate_up, GATED))


def gated_silu(x: torch.Tensor, gate_up: torch.Tensor, config: SkinnyConfig = GATED) -> torch.Tensor:
    """`silu(gate) * up` of the fused gate/up projection [..., K] x [2I, K] -> [..., I] in one launch: the
    projection's output never leaves the kernel, and `fused_silu_mul`'s launch is gone (the caller checked
    `serves_gated`; on the CPU only under Triton's interpreter)."""
    width, in_features = gate_up.shape[0] // 2, gate_up.shape[1]
    flat = x.reshape(-1, in_features)
    rows = flat.shape[0]
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    _gated_silu_kernel[(width // config.block_n,)](
        flat, gate_up, out, rows, width, flat.stride(0), gate_up.stride(0), out.stride(0), K=in_features,
        BLOCK_M=block_rows(rows), BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages)
    return out.view(*x.shape[:-1], width)


def launch(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> torch.Tensor:
    """The kernel's `x @ weight.T` (the caller checked `fits`; on the CPU only under Triton's interpreter)."""
    out_features, in_features = weight.shape
    flat = x.reshape(-1, in_features)
    rows = flat.shape[0]
    out = torch.empty((rows, out_features), dtype=x.dtype, device=x.device)
    grid = (out_features // config.block_n, config.split_k)
    common = dict(K_PER_SPLIT=in_features // config.split_k, BLOCK_M=block_rows(rows), BLOCK_N=config.block_n,
                  BLOCK_K=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages)
    if config.split_k == 1:
        _skinny_linear_kernel[grid](flat, weight, out, rows, flat.stride(0), weight.stride(0), out.stride(0), 0,
                                    PARTIAL=False, **common)
    else:
        partial = partial_sums(flat, weight, config).partials
        count = rows * out_features
        _sum_splits_kernel[(triton.cdiv(count, SUM_BLOCK),)](partial, out, count, partial.stride(0),
                                                             SPLITS=config.split_k, BLOCK=SUM_BLOCK)
    return out.view(*x.shape[:-1], out_features)
