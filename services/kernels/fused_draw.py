"""The keyed draw of `sampling.sample` after the top candidates, as one Triton kernel on CUDA.

Given each row's candidates (values already divided by the temperature, most likely first, and their vocab ids),
the torch form cuts the tail past top-k, cuts the tail past top-p (softmax and running mass in float64), adds the
keyed Gumbel noise, takes the argmax, gathers the id and falls back to the greedy id for temperature-0 rows: some
twenty-five launches per codebook, sixteen codebooks per frame. Here it is one launch, one program per row.

Same draws as the torch form: the noise is the same exact integer hash (`fused_gumbel`), the masks the same
comparisons; only the float64 running mass may round differently in its last bit, which can move a top-p cut only
when a prefix's mass equals top_p to within 1e-16. Off CUDA the torch form serves; the CPU tests check this kernel
under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels import fused_gumbel
from services.kernels.triton_support import tl, triton

if triton is not None:

    @triton.jit
    def _draw_kernel(values_ptr, ids_ptr, top_k_ptr, top_p_ptr, keys_ptr, temperature_ptr, greedy_ptr, out_ptr,
                     salt_a, salt_b, first, second, num_cols, vocab_size, stride_values, stride_ids, stride_keys,
                     stride_lane, stride_top_k, stride_top_p, stride_temperature, stride_greedy,
                     USES_TOP_P: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < num_cols
        values = tl.load(values_ptr + row * stride_values + cols, mask=inside, other=float("-inf")).to(tl.float64)
        ids = tl.load(ids_ptr + row * stride_ids + cols, mask=inside, other=0)
        top_k = tl.load(top_k_ptr + row * stride_top_k)
        top_k = tl.where(top_k > 0, top_k, vocab_size)
        values = tl.where(cols >= top_k, float("-inf"), values)
        if USES_TOP_P:
            top_p = tl.load(top_p_ptr + row * stride_top_p).to(tl.float64)
            exps = tl.exp(values - tl.max(values, axis=0))
            probs = exps / tl.sum(exps, axis=0)
            mass_before = tl.cumsum(probs, axis=0) - probs
            # The most likely token always survives; top_p == 1 keeps every token, whatever the rounding (its
            # limit is above any mass).
            limit = tl.where(top_p < 1.0, top_p, 2.0)
            cut = (mass_before >= limit) & (cols > 0)
            values = tl.where(cut, float("-inf"), values)
        lane_a = tl.load(keys_ptr + row * stride_keys).to(tl.uint32) ^ salt_a.to(tl.uint32)
        lane_b = tl.load(keys_ptr + row * stride_keys + stride_lane).to(tl.uint32) ^ salt_b.to(tl.uint32)
        bits = fused_gumbel._hash32(fused_gumbel._hash32(lane_a ^ ids.to(tl.uint32), first, second) ^ lane_b,
                                    first, second)
        uniform = (bits.to(tl.float64) + 0.5) / 4294967296.0
        scores = tl.where(inside, values - tl.log(-tl.log(uniform)), float("-inf"))
        choice = tl.argmax(scores, axis=0)
        drawn = tl.sum(tl.where(cols == choice, ids, 0), axis=0)
        temperature = tl.load(temperature_ptr + row * stride_temperature)
        tl.store(out_ptr + row, tl.where(temperature > 0, drawn, tl.load(greedy_ptr + row * stride_greedy)))


def draw(values: torch.Tensor, ids: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor,
         salts: tuple[int, int], temperature: torch.Tensor, greedy: torch.Tensor, vocab_size: int,
         uses_top_p: bool) -> torch.Tensor:
    """int64 [B]: each row's draw among its candidates values [B, K] (float32, temperature applied, descending) with
    vocab ids [B, K]; top_k [B] (0: no cut), top_p [B], keys [B, 2], the codebook's salts; rows of temperature 0
    take `greedy` [B]. `uses_top_p` False skips the top-p cut (every row has top_p 1)."""
    rows, num_cols = values.shape
    out = torch.empty(rows, dtype=torch.int64, device=values.device)
    if rows:
        _draw_kernel[(rows,)](
            values, ids, top_k, top_p, keys, temperature, greedy, out, salts[0], salts[1],
            fused_gumbel.HASH_MULTIPLIERS[0], fused_gumbel.HASH_MULTIPLIERS[1], num_cols, vocab_size,
            values.stride(0), ids.stride(0), keys.stride(0), keys.stride(1),
            # Per-row parameters may be columns of a wider table (the sampling graphs' static inputs): read with
            # their strides, never as if dense.
            top_k.stride(0), top_p.stride(0), temperature.stride(0), greedy.stride(0),
            USES_TOP_P=uses_top_p, BLOCK=triton.next_power_of_2(num_cols))
    return out
