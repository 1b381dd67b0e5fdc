"""The engine on the decode fast path: outputs unchanged, and the padded graph step's dummy rows harmless.

On the CPU the padded step runs eagerly over the same static buffers a CUDA graph replays (the bucketing,
the dummy rows, the scratch block), so everything but the capture itself is checked here; the capture
runs in the CUDA-only test at the end and in `loadtest/gpu/gpu_decode_path.py`.
"""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.decode_graphs import DecodeBucketError, DecodeGraphSpec, PaddedDecodeStep, buckets
from services.engine.engine import Engine
from services.engine.errors import ConfigError
from services.engine.runner import ModelRunner
from services.model import paged_attention
from services.model.attention_batch import AttentionBatch
from services.model.sampling import SamplingParams
from tests.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record

NUM_FRAMES = 10
PARAMS = [SamplingParams(temperature=0.0, repetition_penalty=1.0), SamplingParams(),
          SamplingParams(temperature=0.9, top_k=7)]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _padded(engine: Engine, capture: bool = False) -> Engine:
    """The engine with its runner rebuilt to pad and (on CUDA) graph decode-only steps."""
    config = engine.config
    spec = DecodeGraphSpec(config.max_num_seqs, -(-config.max_model_len // config.block_size), capture)
    engine.runner = ModelRunner(engine.model, engine.num_blocks, config.block_size, capture_hidden=True,
                                decode_graphs=spec)
    return engine


def _staggered(engine: Engine, tokenizer) -> EngineRun:
    """Three requests arriving on steps 0, 2 and 3 (so decode steps of 1, 2 and 3 rows), run to the end."""
    arrivals = {0: 0, 2: 1, 3: 2}
    run = EngineRun()
    while run.steps < 4 or engine.has_unfinished():
        index = arrivals.get(run.steps)
        if index is not None:
            request = make_request(tokenizer, TEXTS[index], ("ryan", "vivian", "eric")[index])
            assert engine.add_request(str(index), request, 100 + index, PARAMS[index], NUM_FRAMES) is None
        record(run, engine)
        assert run.steps < 200
    return run


def _assert_same(run: EngineRun, expected: EngineRun) -> None:
    assert sorted(run.codes) == sorted(expected.codes) == ["0", "1", "2"]
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id
        torch.testing.assert_close(run.hidden_of(request_id), expected.hidden_of(request_id), atol=1e-5, rtol=0)


def test_fast_path_leaves_engine_outputs_unchanged(tiny, monkeypatch):
    model, tokenizer = tiny
    fast = _staggered(new_engine(model, blocks=40), tokenizer)
    monkeypatch.setattr(paged_attention, "select_kernel", lambda batch: paged_attention.REFERENCE)
    reference = _staggered(new_engine(model, blocks=40), tokenizer)
    assert len(set(reference.stacked("1")[:, 0].tolist())) > 2, "degenerate output proves nothing"
    _assert_same(fast, reference)


def test_padded_decode_step_leaves_engine_outputs_unchanged(tiny):
    model, tokenizer = tiny
    expected = _staggered(new_engine(model, blocks=40), tokenizer)
    engine = _padded(new_engine(model, blocks=40))
    run = _staggered(engine, tokenizer)
    _assert_same(run, expected)
    # Steps of 1, 2 and 3 rows ran padded (3 rows in the 4-row bucket: one dummy row).
    rows_used = {rows for rows, _ in engine.runner.decode_step.prepared}
    assert {1, 2, 4} <= rows_used


def test_padded_decode_step_with_preemption_replays_faithfully(tiny):
    model, tokenizer = tiny
    expected = _staggered(new_engine(model, blocks=40), tokenizer)
    engine = _padded(new_engine(model, blocks=11, mode="allow"))
    run = _staggered(engine, tokenizer)
    assert run.preempted, "the pool was meant to be too small for all three"
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id


@torch.inference_mode()
def test_dummy_rows_write_only_the_scratch_block(tiny):
    model, _ = tiny
    talker, block, num_blocks = model.talker, 4, 20
    generator = torch.Generator().manual_seed(9)
    pool = torch.randn(talker.kv_pool_shape(num_blocks + 1, block), generator=generator)
    step = PaddedDecodeStep(talker, pool, scratch_block=num_blocks, spec=DecodeGraphSpec(8, 16, capture=False))
    # Three decode rows (cached 2, 5, 9 tokens) in shuffled blocks: bucket (4 rows, 4 columns).
    tables = torch.tensor([[7, 0, 0], [3, 12, 0], [15, 1, 9]])
    seq_lens = torch.tensor([3, 6, 10])
    positions = seq_lens - 1
    slots = tables.gather(1, (positions // block)[:, None])[:, 0] * block + positions % block
    batch = AttentionBatch(positions, slots, torch.arange(4), seq_lens, tables, max_seq_len=10)
    embeds = torch.randn(3, talker.hidden_size, generator=generator)
    original, eager_pool = pool.clone(), pool.clone()
    expected = talker(embeds, batch, eager_pool)
    got = step.run(embeds, batch)
    assert step.bucket(batch) == (4, 4) and list(step.prepared) == [(4, 4)]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # The rows' own slots hold what the eager step wrote (the padded matmuls may round differently) ...
    torch.testing.assert_close(pool[:num_blocks], eager_pool[:num_blocks], atol=1e-5, rtol=0)
    # ... every other block is untouched, bit for bit, and the dummy row wrote into the scratch block.
    owned = {int(b) for row, n in zip(tables, (1, 2, 3)) for b in row[:n]}
    for other in sorted(set(range(num_blocks)) - owned):
        assert torch.equal(pool[other], original[other]), f"block {other} was written"
    assert not torch.equal(pool[num_blocks], original[num_blocks]), "the dummy row wrote its K/V somewhere else"
    prefill = AttentionBatch(torch.arange(2), torch.arange(2), torch.tensor([0, 2]), torch.tensor([2]),
                             torch.tensor([[0]]), max_seq_len=2)
    with pytest.raises(DecodeBucketError) as raised:
        step.run(torch.zeros(2, talker.hidden_size), prefill)
    assert raised.value.code == "no_decode_bucket" and step.bucket(prefill) is None
    nine = torch.arange(9)  # more rows than the largest bucket (8): the runner steps eagerly instead
    assert step.bucket(AttentionBatch(nine * 0, nine * block, torch.arange(10), nine * 0 + 1, nine[:, None])) is None


def test_buckets_and_spec():
    assert buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets(6) == (1, 2, 4, 6) and buckets(1) == (1,)
    config = EngineConfig(kv_cache_blocks=8, block_size=16, max_model_len=1000, max_num_seqs=12)
    assert DecodeGraphSpec.for_engine(config, torch.device("cpu")) is None  # ignored on the CPU
    assert DecodeGraphSpec.for_engine(config, torch.device("cuda")) == DecodeGraphSpec(12, 63)
    assert DecodeGraphSpec.for_engine(EngineConfig(kv_cache_blocks=8, cuda_graphs=False), torch.device("cuda")) is None
    with pytest.raises(ConfigError, match="cuda_graphs"):
        EngineConfig(kv_cache_blocks=8, cuda_graphs="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_engine_equals_eager_on_cuda(tiny_checkpoint):
    from services.model.loader import load_model
    from services.model.text_tokenizer import TextTokenizer

    model, tokenizer = load_model(tiny_checkpoint, device=torch.device("cuda")), TextTokenizer.from_dir(tiny_checkpoint)
    graphed = new_engine(model, blocks=40)  # cuda_graphs defaults on
    run = _staggered(graphed, tokenizer)
    assert {1, 2, 4} <= {rows for rows, _ in graphed.runner.decode_step.prepared}
    eager = new_engine(model, blocks=40)
    eager.runner.decode_step = None
    expected = _staggered(eager, tokenizer)
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id
