"""Paged attention as one Triton kernel: each new token reads its sequence's cached K/V in place, up to itself.

The plain-torch decode kernel (`paged_decode.py`) gathers every row's block columns into a dense copy, zeroes
the stale slots and hands the copy to SDPA: about four passes over a padded [B, L] cache per layer, L set by
the widest row of the bucket. This kernel walks each sequence's own block table up to its own length, with
an online softmax, so the bytes read are the cache's real size and nothing is written but the output.

One program serves one (token, K/V head) pair and all the query heads that share that K/V head
(grouped-query attention): the G query rows are a small [G, D] tile scored against [N, D] key tiles
with broadcast products, which suits G of 1..8 better than the matrix units. Keys past a sequence's length
are never loaded, so stale slots (NaN included) cannot leak in. A token names its block-table row and how
many cache entries it sees, so a decode row (one token, its whole sequence) and the tokens of a prefill chunk
(each up to its own position: causal) are the same case, and one call serves a mixed step. Every size is a
tensor shape except the loop's trip count, which the kernel reads on the device: the call needs no host sync
and can be captured in a CUDA graph whose only fixed shape is the number of tokens.

Triton runs on CUDA devices; on the CPU the same code runs under `TRITON_INTERPRET=1` (tests) and the
torch kernel stays the CPU path.
"""

from __future__ import annotations

import torch

from services.kernels.triton_support import tl, triton


if triton is not None:

    @triton.jit
    def _decode_kernel(
        q_ptr, pool_ptr, tables_ptr, rows_ptr, seq_lens_ptr, out_ptr,
        scale, layer,
        stride_qb, stride_qh,
        stride_pb, stride_pl, stride_pkv, stride_pt, stride_ph,
        stride_tb, stride_rb, stride_lb, stride_ob, stride_oh,
        BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROWS: tl.constexpr,
    ):
        token = tl.program_id(0)
        row = tl.load(rows_ptr + token * stride_rb) if HAS_ROWS else token
        kv_head = tl.program_id(1)
        groups = tl.arange(0, GROUP_P)
        dims = tl.arange(0, HEAD_DIM)
        heads = kv_head * GROUP + groups
        group_ok = groups < GROUP
        q = tl.load(q_ptr + token * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                    mask=group_ok[:, None], other=0.0).to(tl.float32)
        seq_len = tl.load(seq_lens_ptr + token * stride_lb).to(tl.int32)
        best = tl.full((GROUP_P,), float("-inf"), tl.float32)
        total = tl.zeros((GROUP_P,), tl.float32)
        acc = tl.zeros((GROUP_P, HEAD_DIM), tl.float32)
        base = pool_ptr + layer * stride_pl + kv_head * stride_ph
        start = 0
        while start < seq_len:  # a while loop: the trip count is data, read on the device
            tokens = start + tl.arange(0, BLOCK_N)
            valid = tokens < seq_len
            blocks = tl.load(tables_ptr + row * stride_tb + tokens // BLOCK_SIZE, mask=valid, other=0)
            where = blocks.to(tl.int64) * stride_pb + (tokens % BLOCK_SIZE) * stride_pt
            keys = tl.load(base + where[:, None] + dims[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [GROUP_P, BLOCK_N]
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            values = tl.load(base + stride_pkv + where[:, None] + dims[None, :], mask=valid[:, None],
                             other=0.0).to(tl.float32)
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * values[None, :, :], axis=1)
            total = total * rescale + tl.sum(weights, axis=1)
            best = new_best
            start += BLOCK_N
        out = acc / total[:, None]
        tl.store(out_ptr + token * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=group_ok[:, None])


def decode_attention(q: torch.Tensor, pool: torch.Tensor, layer: int, tables: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, block_n: int = 32, token_rows: torch.Tensor | None = None,
                     num_warps: int = 1) -> torch.Tensor:
    """Attention of each new token q [T, Hq, D] to the first seq_lens[t] cache entries of its table row -> [T, Hq, D].

    `pool` is the block-major pool [blocks, layers, 2, block_size, Hkv, D] (already holding the new tokens);
    `tables` [R, C] the rows' blocks (entries past what a token sees are never read); seq_lens [T] >= 1;
    `token_rows` [T] the table row of each token (None: token t reads row t, one token per row as in decode).
    `block_n` (cache entries a loop step reads) and `num_warps` are the launch's tuning knobs. The defaults suit the
    0.6B talker's decode shapes (64 rows, 64-512 cached tokens): one warp and 32 entries a step, as a token's
    attention over a few hundred entries leaves little work to share among more warps.
    """
    rows, num_heads, head_dim = q.shape
    block_size, kv_heads = pool.shape[3], pool.shape[4]
    group = num_heads // kv_heads
    q = q.contiguous()
    out = torch.empty_like(q)
    if pool.stride(5) != 1 or tables.stride(1) != 1:
        raise ValueError("decode_attention needs a pool with contiguous head_dim and a row-major block table")
    _decode_kernel[(rows, kv_heads)](
        q, pool, tables, seq_lens if token_rows is None else token_rows, seq_lens, out, scale, layer,
        q.stride(0), q.stride(1),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), pool.stride(4),
        tables.stride(0), 0 if token_rows is None else token_rows.stride(0), seq_lens.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, GROUP=group, GROUP_P=triton.next_power_of_2(group), HEAD_DIM=head_dim,
        BLOCK_N=block_n, HAS_ROWS=token_rows is not None, num_warps=num_warps,
    )
    return out
