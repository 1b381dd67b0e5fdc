"""The sync-free decode attention path: equal to the reference kernel, chosen by shape, and free of host syncs.

Pools are random with the blocks shuffled and every block no sequence owns poisoned with NaN, heads are
grouped (GQA) or not, and lengths are ragged across block boundaries. "No host sync" is shown two ways:
the whole talker decode step runs on the `meta` device (which has no values, so any read of one fails)
and on the CPU with every Python-level tensor-to-host conversion made to raise; the reference path fails
both checks, which shows they can fail.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from loadtest.gpu.gpu_models import write_config_files
from services.model import paged_attention
from services.model.attention_batch import AttentionBatch
from services.model.config import load_config
from services.model.loader import load_model
from services.model.paged_attention import DECODE, REFERENCE, PagedAttention, select_kernel
from services.model.talker import Talker

BLOCK = 4


def _batch(rows: list[tuple[int, int, list[int]]], width: int | None = None, pad: int = 0,
           max_seq_len: bool = True) -> AttentionBatch:
    """rows: (tokens already cached, new tokens, the sequence's blocks); tables padded with `pad`."""
    positions, slots, starts, lens = [], [], [0], []
    width = width or max(len(blocks) for _, _, blocks in rows)
    for cached, new, blocks in rows:
        for p in range(cached, cached + new):
            positions.append(p)
            slots.append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(starts[-1] + new)
        lens.append(cached + new)
    tables = [blocks + [pad] * (width - len(blocks)) for _, _, blocks in rows]
    return AttentionBatch(torch.tensor(positions), torch.tensor(slots), torch.tensor(starts), torch.tensor(lens),
                          torch.tensor(tables), max(lens) if max_seq_len else None)


def _decode_rows(lengths: list[int], num_blocks: int, generator: torch.Generator) -> tuple[list, set[int]]:
    """One new token per sequence on top of `lengths` cached tokens, in shuffled blocks; also the used blocks."""
    order = torch.randperm(num_blocks, generator=generator).tolist()
    rows, used = [], set()
    for cached in lengths:
        count = -(-(cached + 1) // BLOCK)
        blocks, order = order[:count], order[count:]
        rows.append((cached, 1, blocks))
        used.update(blocks)
    return rows, used


def _poisoned_pool(shape: tuple[int, ...], used: set[int], generator: torch.Generator) -> torch.Tensor:
    pool = torch.randn(shape, generator=generator)
    for block in set(range(shape[0])) - used:
        pool[block] = float("nan")
    return pool


@pytest.mark.parametrize(("num_heads", "kv_heads"), [(4, 2), (8, 2), (4, 4)])
@pytest.mark.parametrize(("width", "pad", "max_seq_len"), [(None, 0, True), (7, -1, False), (7, 0, True)])
def test_decode_kernel_equals_reference(num_heads, kv_heads, width, pad, max_seq_len):
    generator = torch.Generator().manual_seed(num_heads * 10 + kv_heads)
    layers, head_dim, num_blocks = 3, 16, 30
    # Ragged: one token, a block edge (4, 7, 8), mid-block, and a longer row.
    rows, used = _decode_rows([0, 3, 4, 7, 9, 17], num_blocks, generator)
    batch = _batch(rows, width, pad, max_seq_len)
    pool = _poisoned_pool((num_blocks, layers, 2, BLOCK, kv_heads, head_dim), used, generator)
    scale = head_dim**-0.5
    fast_pool, reference_pool = pool.clone(), pool.clone()
    fast = PagedAttention(fast_pool, batch, scale, DECODE)
    reference = PagedAttention(reference_pool, batch, scale, REFERENCE)
    for layer in range(layers):
        q = torch.randn(len(rows), num_heads, head_dim, generator=generator)
        k, v = (torch.randn(len(rows), kv_heads, head_dim, generator=generator) for _ in range(2))
        got, expected = fast(layer, q, k, v), reference(layer, q, k, v)
        assert got.shape == expected.shape == (len(rows), num_heads, head_dim)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # Both wrote the same K/V to the same slots and nothing else.
    torch.testing.assert_close(fast_pool, reference_pool, equal_nan=True, atol=0, rtol=0)


def test_decode_kernel_reads_only_the_visible_tokens():
    """A value planted in a row's stale slot (same block, past its length) changes nothing."""
    generator = torch.Generator().manual_seed(3)
    rows, used = _decode_rows([5, 2], 8, generator)
    batch = _batch(rows)
    pool = _poisoned_pool((8, 1, 2, BLOCK, 2, 16), used, generator)
    q, k, v = torch.randn(2, 4, 16), torch.randn(2, 2, 16), torch.randn(2, 2, 16)
    before = PagedAttention(pool.clone(), batch, 0.25, DECODE)(0, q, k, v)
    stale_block = rows[1][2][0]
    pool[stale_block, 0, :, 3] = 1e6  # row 1 holds 3 tokens: slot 3 of its block is past its length
    after = PagedAttention(pool, batch, 0.25, DECODE)(0, q, k, v)
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_select_kernel_by_shape():
    decode = _batch([(3, 1, [0]), (8, 1, [1, 2, 3])])
    mixed = _batch([(3, 1, [0]), (0, 5, [1, 2])])
    prefill = _batch([(0, 6, [0, 1])])
    assert select_kernel(decode) is DECODE
    assert select_kernel(mixed) is REFERENCE and select_kernel(prefill) is REFERENCE
    assert select_kernel(_batch([(0, 1, [0])])) is DECODE  # a one-token prompt is a decode-shaped step


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint):
    return load_model(tiny_checkpoint)


@torch.inference_mode()
def test_talker_decode_step_equals_reference(tiny_model):
    talker = tiny_model.talker
    generator = torch.Generator().manual_seed(5)
    rows, used = _decode_rows([0, 6, 11, 12, 30], 24, generator)
    batch = _batch(rows)
    pool = _poisoned_pool(talker.kv_pool_shape(24, BLOCK), used, generator)
    embeds = torch.randn(len(rows), talker.hidden_size, generator=generator)
    fast = talker(embeds, batch, pool.clone())  # selected by shape
    reference = talker(embeds, batch, pool.clone(), kernel=REFERENCE)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0)


def _meta_step(kernel) -> torch.Tensor:
    """A tiny talker's decode step of 3 rows with every tensor on `meta` (no values exist to read)."""
    with tempfile.TemporaryDirectory() as scratch:
        config, _ = load_config(write_config_files(Path(scratch) / "tiny", "tiny"))
    with torch.device("meta"):
        talker = Talker(config.talker)
        pool = torch.empty(talker.kv_pool_shape(16, BLOCK))
        embeds = torch.empty(3, talker.hidden_size)
        tables = torch.empty(3, 4, dtype=torch.int64)
        ints = [torch.empty(n, dtype=torch.int64) for n in (3, 3, 4, 3)]
    batch = AttentionBatch(ints[0], ints[1], ints[2], ints[3], tables)
    with torch.inference_mode():
        return talker(embeds, batch, pool, kernel=kernel)


def test_decode_step_runs_on_meta_tensors_where_the_reference_cannot():
    out = _meta_step(None)
    assert out.device.type == "meta" and out.shape == (3, 64)
    with pytest.raises((RuntimeError, NotImplementedError)):
        _meta_step(REFERENCE)


def _raise(*_args, **_kwargs):
    raise AssertionError("host sync: a tensor value was read on the host")


@torch.inference_mode()
def test_decode_step_reads_no_tensor_on_the_host(tiny_model, monkeypatch):
    talker = tiny_model.talker
    generator = torch.Generator().manual_seed(6)
    rows, used = _decode_rows([2, 9], 12, generator)
    batch = _batch(rows, max_seq_len=False)
    pool = _poisoned_pool(talker.kv_pool_shape(12, BLOCK), used, generator)
    embeds = torch.randn(2, talker.hidden_size, generator=generator)
    with monkeypatch.context() as patched:
        for name in ("__int__", "__index__", "__bool__", "__float__", "item", "tolist"):
            patched.setattr(torch.Tensor, name, _raise)
        out = talker(embeds, batch, pool.clone())
        with pytest.raises(AssertionError, match="host sync"):
            talker(embeds, batch, pool.clone(), kernel=REFERENCE)
    assert torch.isfinite(out).all()
    assert paged_attention.select_kernel(batch) is DECODE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sync debug mode needs CUDA")
@torch.inference_mode()
def test_decode_step_has_no_sync_on_cuda(tiny_checkpoint):
    talker = load_model(tiny_checkpoint, device=torch.device("cuda")).talker
    generator = torch.Generator().manual_seed(7)
    rows, used = _decode_rows([2, 9, 4], 16, generator)
    batch = _batch(rows)
    batch = AttentionBatch(*(t.cuda() for t in (batch.positions, batch.slot_mapping, batch.query_start,
                                                 batch.seq_lens, batch.block_tables)), batch.max_seq_len)
    pool = _poisoned_pool(talker.kv_pool_shape(16, BLOCK), used, generator).cuda()
    embeds = torch.randn(3, talker.hidden_size, generator=generator).cuda()
    talker(embeds, batch, pool)  # first call: lazy set-up (RoPE's device table) may copy
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = talker(embeds, batch, pool)
        with pytest.raises(RuntimeError):
            talker(embeds, batch, pool, kernel=REFERENCE)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all()
