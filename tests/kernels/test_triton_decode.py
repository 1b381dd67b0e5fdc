"""The fused Triton decode kernel against the plain-torch decode kernel, on random pools with NaN-filled stale blocks.

On the CPU the kernel runs under Triton's interpreter, which is chosen when Triton is imported, so that check runs
in a fresh process with TRITON_INTERPRET=1 (the rest of the suite keeps the torch kernel on the CPU). On a CUDA
device the compiled kernel is checked in this process, in float32 and bfloat16.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.model import paged_attention
from services.model.attention_batch import AttentionBatch
from services.model.paged_decode import DecodeLayout, decode_kernel
from tests.support.triton_interpreter import interpreted

# (query heads, K/V heads, head dim, block size, lengths): grouped 2 and 4, plain multi-head, one-token rows,
# rows ending mid-block and on a block edge, a row longer than one loop tile.
CASES = [
    (4, 2, 16, 4, [1, 5, 9, 16, 13]),
    (8, 2, 32, 8, [3, 8, 40, 17]),
    (2, 2, 16, 16, [1, 70, 33]),
]


def compare(device: str, dtype: torch.dtype = torch.float32) -> float:
    """Largest |fused - torch| over CASES (relative to the output's scale); raises on NaN or a shape mismatch."""
    from services.kernels import triton_decode

    generator = torch.Generator().manual_seed(7)
    worst = 0.0
    for num_heads, kv_heads, head_dim, block_size, lengths in CASES:
        rows, layers = len(lengths), 3
        blocks_needed = sum(-(-n // block_size) for n in lengths)
        pool = torch.randn(blocks_needed + 4, layers, 2, block_size, kv_heads, head_dim, generator=generator)
        pool[0] = float("nan")  # the padding columns point here: a kernel that reads past a length returns NaN
        width = max(-(-n // block_size) for n in lengths) + 1
        tables = torch.zeros((rows, width), dtype=torch.int64)
        order = (torch.randperm(blocks_needed, generator=generator) + 4).tolist()
        for row, length in enumerate(lengths):
            count = -(-length // block_size)
            tables[row, :count] = torch.tensor(order[:count])
            order = order[count:]
        lens = torch.tensor(lengths)
        q = torch.randn(rows, num_heads, head_dim, generator=generator)
        pool, tables, lens, q = pool.to(device, dtype), tables.to(device), lens.to(device), q.to(device, dtype)
        batch = AttentionBatch(positions=lens - 1, slot_mapping=lens, query_start=torch.arange(rows + 1),
                               seq_lens=lens, block_tables=tables)
        scale = head_dim**-0.5
        clean = pool.nan_to_num(0.0)  # the torch kernel zeroes stale slots itself; its padding reads stay finite
        expected = decode_kernel(q.float(), clean.float(), 1, DecodeLayout.of(batch, block_size, torch.float32), scale)
        got = triton_decode.decode_attention(q, pool, 1, tables, lens, scale, block_n=8)
        if got.shape != expected.shape or bool(torch.isnan(got).any()):
            raise AssertionError(f"bad output: shape {tuple(got.shape)}, NaN {bool(torch.isnan(got).any())}")
        worst = max(worst, float((got.float() - expected).abs().max() / expected.abs().max()))
        # The per-token form of the same step: each row's cache seen by three tokens, causally (a prefill chunk),
        # with the token metadata in strided columns as the engine's padded step keeps it.
        metadata = torch.stack([torch.arange(rows).repeat_interleave(3), (lens.cpu() - 2).clamp(min=1)
                                .repeat_interleave(3) + torch.arange(3).repeat(rows)], dim=1).to(device)
        token_rows, limits = metadata[:, 0], metadata[:, 1].clamp(max=lens.repeat_interleave(3))
        per_token = q.repeat_interleave(3, dim=0)
        expected = decode_kernel(per_token.float(), clean.float(), 1, DecodeLayout.of(
            replace(batch, block_tables=tables[token_rows], seq_lens=limits), block_size, torch.float32), scale)
        got = triton_decode.decode_attention(per_token, pool, 1, tables, limits, scale, block_n=8,
                                             token_rows=token_rows)
        if bool(torch.isnan(got).any()):
            raise AssertionError("NaN in the per-token form")
        worst = max(worst, float((got.float() - expected).abs().max() / expected.abs().max()))
    return worst


def test_fused_kernel_equals_the_torch_kernel_under_the_interpreter():
    assert interpreted("tests.kernels.test_triton_decode.compare('cpu')") < 1e-5


def test_the_kernel_serves_cuda_tensors_only_and_the_torch_kernels_the_rest():
    from services.kernels import triton_decode
    from services.kernels.triton_support import compiles_for

    assert triton_decode.triton is not None, "Triton is a test dependency (pyproject's test extra)"
    assert not compiles_for(torch.device("cpu")) and compiles_for(torch.device("cuda"))
    lens = torch.tensor([3, 5])
    decode_only = AttentionBatch(positions=lens - 1, slot_mapping=lens, query_start=torch.arange(3), seq_lens=lens,
                                 block_tables=torch.zeros((2, 2), dtype=torch.int64))
    assert paged_attention.select_kernel(decode_only) is paged_attention.DECODE  # on the CPU: the torch kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_kernel_equals_the_torch_kernel_on_cuda(dtype, tolerance):
    assert compare("cuda", dtype) < tolerance
