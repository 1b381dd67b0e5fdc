"""`sampling.sample` without top-p as one Triton kernel on CUDA: raw logits in, one token per row out.

The torch form orders each row's top-k candidates (torch.topk: two kernels and most of the sampling time at 16 draws
a frame), then draws among them. Without top-p a draw needs only which tokens they are, not their order, so each
program finds its row's k-th largest value by bisection: 32 rounds of counting the values at or above a guess, over
an integer image of the floats that keeps their order, all in registers. The candidates are the values above that
threshold plus, among the values equal to it, the lowest vocab ids until k are taken. The noise is `fused_draw`'s.

The rules are the torch form's with its stable sort (`sampling._top` when the batch keeps the whole vocabulary), so
the result is defined whatever the ties, and a row's token depends on nothing but that row:
- ties at the k-th value: the lowest vocab ids are kept (a sort that keeps ties in vocab order, then the first k);
- equal Gumbel scores: the higher value wins, then the lower vocab id (the first of them in that sorted order);
- -0.0 equals +0.0;
- NaN ranks above every number: it is the greedy token (the first NaN, as torch's argmax) and, when it is a
  candidate, the drawn one (the lowest-id NaN among the candidates, as torch's argmax over NaN scores);
- temperature-0 rows return the argmax of the raw logits, first index on ties.
"""

from __future__ import annotations

import torch

from services.kernels import fused_gumbel
from services.kernels.triton_support import tl, triton

MAX_VOCAB = 16384
"""The widest row one program holds in registers; wider rows keep the torch form's path."""
NUM_WARPS = 8
"""A 4096-wide row (the talker's 3072) in 256 threads: 16 lanes a thread, their float64 scores included, in
registers. A first guess: to be tuned on the GPU against 4 and 16."""

if triton is not None:
    _BELOW_EVERY_KEY = tl.constexpr(-(2**31))
    """The order key of lanes past the row's end: below every float's, -inf's included."""
    _NAN_KEY = tl.constexpr(2**31 - 1)

    @triton.jit
    def _order_key(values, inside):
        """int32 whose signed order is the float32 order: NaN largest, -0.0 == +0.0, lanes outside the row lowest."""
        values = tl.where(values == 0.0, 0.0, values)
        bits = values.to(tl.int32, bitcast=True)
        # Negative floats grow as their magnitude bits shrink: flipping those bits makes them count upwards.
        order = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        order = tl.where(values != values, _NAN_KEY, order)
        return tl.where(inside, order, _BELOW_EVERY_KEY)

    @triton.jit
    def _kth_largest(order, inside, k):
        """The k-th largest order key of the row (1 <= k <= its length): the largest t with at least k keys >= t,
        decided one bit at a time from the sign down (within one sign, the lower 31 bits count upwards)."""
        non_negative = tl.sum((inside & (order >= 0)).to(tl.int32), axis=0)
        threshold = tl.where(non_negative >= k, 0, _BELOW_EVERY_KEY)
        for step in range(31):
            guess = threshold | (1 << (30 - step))
            at_least = tl.sum((inside & (order >= guess)).to(tl.int32), axis=0)
            threshold = tl.where(at_least >= k, guess, threshold)
        return threshold

    @triton.jit
    def _top_k_mask(order, inside, k):
        """The row's k candidates: the values above the k-th largest, then the lowest-id values equal to it."""
        threshold = _kth_largest(order, inside, k)
        above = inside & (order > threshold)
        tied = inside & (order == threshold)
        still_needed = k - tl.sum(above.to(tl.int32), axis=0)
        return above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= still_needed))

    @triton.jit
    def _lowest(cols, chosen, BLOCK: tl.constexpr):
        return tl.min(tl.where(chosen, cols, BLOCK), axis=0)

    @triton.jit
    def _sample_kernel(logits_ptr, temperature_ptr, top_k_ptr, row_keys_ptr, out_ptr, salt_a, salt_b, first, second,
                       vocab_size, stride_row, stride_col, stride_temperature, stride_top_k, stride_keys,
                       stride_lane, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < vocab_size
        raw = tl.load(logits_ptr + row * stride_row + cols * stride_col, mask=inside, other=0.0).to(tl.float32)
        temperature = tl.load(temperature_ptr + row * stride_temperature)
        is_sampled = temperature > 0
        divisor = tl.broadcast_to(tl.where(is_sampled, temperature, 1.0), [BLOCK])
        # div_rn: torch divides with IEEE rounding, where Triton's `/` on float32 is an approximate division.
        scaled = tl.div_rn(raw, divisor)
        order = _order_key(scaled, inside)
        greedy = _lowest(cols, order == tl.max(order, axis=0), BLOCK)

        top_k = tl.load(top_k_ptr + row * stride_top_k)  # int64: narrowed only once below the vocabulary
        k = tl.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size).to(tl.int32)
        candidate = _top_k_mask(order, inside, k)

        lane_a = tl.load(row_keys_ptr + row * stride_keys).to(tl.uint32) ^ salt_a.to(tl.uint32)
        lane_b = tl.load(row_keys_ptr + row * stride_keys + stride_lane).to(tl.uint32) ^ salt_b.to(tl.uint32)
        bits = fused_gumbel._hash32(fused_gumbel._hash32(lane_a ^ cols.to(tl.uint32), first, second) ^ lane_b,
                                    first, second)
        uniform = (bits.to(tl.float64) + 0.5) / 4294967296.0
        is_nan = scaled != scaled
        scores = tl.where(candidate & ~is_nan, scaled.to(tl.float64) - tl.log(-tl.log(uniform)), float("-inf"))
        best = candidate & ~is_nan & (scores == tl.max(scores, axis=0))
        best = best & (order == tl.max(tl.where(best, order, _BELOW_EVERY_KEY), axis=0))
        nan_candidate = candidate & is_nan
        drawn = tl.where(tl.sum(nan_candidate.to(tl.int32), axis=0) > 0, _lowest(cols, nan_candidate, BLOCK),
                         _lowest(cols, best, BLOCK))
        tl.store(out_ptr + row, tl.where(is_sampled, drawn, greedy).to(tl.int64))


def covers(vocab_size: int) -> bool:
    """Whether `sample` takes rows of `vocab_size` logits (one program holds a whole row)."""
    return 0 < vocab_size <= MAX_VOCAB


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, keys: torch.Tensor,
           salts: tuple[int, int]) -> torch.Tensor:
    """int64 [B]: each row's token from its raw logits [B, V] (float32 or bfloat16, V within `covers`), temperature
    [B] (0: greedy), top_k [B] (0: no cut), keys [B, 2] (`sampling.row_keys`) and the codebook's salts; no top-p.
    One launch, no host synchronisation: safe inside a CUDA graph capture."""
    rows, vocab_size = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _sample_kernel[(rows,)](
            logits, temperature, top_k, keys, out, salts[0], salts[1], fused_gumbel.HASH_MULTIPLIERS[0],
            fused_gumbel.HASH_MULTIPLIERS[1], vocab_size, logits.stride(0), logits.stride(1), temperature.stride(0),
            top_k.stride(0), keys.stride(0), keys.stride(1), BLOCK=triton.next_power_of_2(vocab_size),
            num_warps=NUM_WARPS)
    return out
