"""A pass's state tails written straight into the slot pool, each row's from where its own frames end, in one launch.

A layer's state for the next chunk is the last `history` entries (along dim 2) of its input, its stored past followed
by this pass's new entries. In a pass that carries chunks of different lengths (`pass_plan`), row r's own entries end
at `history + lengths[r] * per_frame`, so its tail starts at `lengths[r] * per_frame`. The torch form gathers each
tail through an index it builds (three launches per layer rate) and copies it into the pool (one more per state);
here one launch per state reads each row's tail where it starts and writes it into the pool row `targets[r]`.
Off CUDA the torch form in `slot_pool.SlotRows` serves; the CPU tests check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.triton_support import tl, triton

BLOCK = 1024

if triton is not None:

    @triton.jit
    def _tail_store_kernel(src_ptr, dst_ptr, lengths_ptr, targets_ptr, per_frame, inner, history, width,
                           stride_sb, stride_sx, stride_sh, stride_sy, stride_db, stride_dx, stride_dh, stride_dy,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0)
        element = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = element < inner * history * width
        x = element // (history * width)
        h = (element // width) % history
        y = element % width
        start = tl.load(lengths_ptr + row) * per_frame
        target = tl.load(targets_ptr + row)
        value = tl.load(src_ptr + row * stride_sb + x * stride_sx + (start + h) * stride_sh + y * stride_sy,
                        mask=inside)
        tl.store(dst_ptr + target * stride_db + x * stride_dx + h * stride_dh + y * stride_dy, value, mask=inside)


def store_tails(full: torch.Tensor, history: int, per_frame: int, lengths: torch.Tensor, targets: torch.Tensor,
                pool: torch.Tensor) -> None:
    """`pool[targets[r]] = full[r, :, s:s + history]` with `s = lengths[r] * per_frame`, for every row r of `full`
    ([B, X, history + n] or [B, X, history + n, Y], any strides); `pool` is [slots, X, history(, Y)]."""
    if full.dim() not in (3, 4) or pool.dim() != full.dim() or pool.shape[1] != full.shape[1] \
            or pool.shape[2] != history or pool.shape[3:] != full.shape[3:] or pool.dtype != full.dtype:
        raise ValueError(f"store_tails needs full [B, X, L(, Y)] and pool [slots, X, {history}(, Y)] of one dtype, got "
                         f"{tuple(full.shape)} {full.dtype} and {tuple(pool.shape)} {pool.dtype}")
    rows, inner = full.shape[0], full.shape[1]
    width = full.shape[3] if full.dim() == 4 else 1
    source = (*full.stride(), 0) if full.dim() == 3 else full.stride()
    destination = (*pool.stride(), 0) if pool.dim() == 3 else pool.stride()
    grid = (rows, triton.cdiv(inner * history * width, BLOCK))
    _tail_store_kernel[grid](full, pool, lengths, targets, per_frame, inner, history, width, *source, *destination,
                             BLOCK=BLOCK)
