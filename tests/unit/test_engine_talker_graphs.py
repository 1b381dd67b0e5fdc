"""The engine on the graphed talker path: outputs unchanged, and the padded step's dummy tokens harmless.

On the CPU the padded step runs eagerly over the same static buffers a CUDA graph replays (token buckets, the
per-token attention form, dummy tokens, the scratch block and the scratch table row), so everything but the
capture itself is checked here; the capture runs in the CUDA-only test at the end and in
`loadtest/gpu/gpu_step_graphs.py`.
"""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.talker_graphs import PaddedTalkerStep, TalkerBucketError, TalkerGraphSpec, buckets
from services.engine.engine import Engine
from services.engine.errors import ConfigError
from services.engine.runner import ModelRunner
from services.engine.engine_request import EngineRequest
from services.model import paged_attention
from services.model.attention_batch import AttentionBatch
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record

NUM_FRAMES = 10
PARAMS = [SamplingParams(temperature=0.0, repetition_penalty=1.0), SamplingParams(),
          SamplingParams(temperature=0.9, top_k=7)]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _padded(engine: Engine, capture: bool = False) -> Engine:
    """The engine with its runner rebuilt to pad and (on CUDA) graph every talker step."""
    config = engine.config
    spec = TalkerGraphSpec(config.max_num_seqs, -(-config.max_model_len // config.block_size),
                           config.max_num_batched_tokens, capture)
    engine.runner = ModelRunner(engine.model, engine.num_blocks, config.block_size, capture_hidden=True, graphs=spec)
    return engine


def _staggered(engine: Engine, tokenizer) -> EngineRun:
    """Three requests arriving on steps 0, 2 and 3 (so decode steps of 1, 2 and 3 rows), run to the end."""
    arrivals = {0: 0, 2: 1, 3: 2}
    run = EngineRun()
    while run.steps < 4 or engine.has_unfinished():
        index = arrivals.get(run.steps)
        if index is not None:
            request = make_request(tokenizer, TEXTS[index], ("ryan", "vivian", "eric")[index])
            assert engine.add_request(EngineRequest(
                str(index), request, 100 + index, PARAMS[index], NUM_FRAMES)) is None
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


def test_padded_talker_step_leaves_engine_outputs_unchanged(tiny, monkeypatch):
    model, tokenizer = tiny
    expected = _staggered(new_engine(model, blocks=40), tokenizer)
    engine = _padded(new_engine(model, blocks=40))
    eager_forwards = []
    monkeypatch.setattr(engine.runner, "_talker", _counting(engine.runner, eager_forwards))
    run = _staggered(engine, tokenizer)
    _assert_same(run, expected)
    # Decode steps of 1, 2 and 3 rows (3 in the 4-token bucket: one dummy), and the prefill steps, whose prompts
    # join decoding rows, ran padded too: not one step took the eager talker.
    assert {1, 2, 4} <= set(engine.runner.talker_step.prepared) and max(engine.runner.talker_step.prepared) >= 16
    assert eager_forwards == []


def test_padded_steps_build_their_inputs_in_the_graphs_buffer(tiny, monkeypatch):
    """Every padded step's input rows, decode-only and mixed, are built where the graph reads them: none is copied in
    (a copy is one more torch call on the engine thread, each a hand-over of the interpreter lock)."""
    model, tokenizer = tiny
    engine = _padded(new_engine(model, blocks=40))
    step, in_place, copied = engine.runner.talker_step, [], []
    original_run, original_copy = step.run, torch.Tensor.copy_

    def run(rows, batch):
        in_place.append(rows.data_ptr() == step.rows.data_ptr() and rows.shape[0] == batch.num_tokens)
        return original_run(rows, batch)

    def copy(self, source, non_blocking=False):
        if self.data_ptr() == step.rows.data_ptr():
            copied.append(tuple(source.shape))
        return original_copy(self, source, non_blocking)

    monkeypatch.setattr(step, "run", run)
    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    _staggered(engine, tokenizer)
    assert len(in_place) > 10 and all(in_place) and copied == []


def _counting(runner: ModelRunner, eager_forwards: list[int]):
    """The runner's `_talker`, recording every step that would not run on the padded (graphed) path."""
    original = runner._talker

    def talker(embeds, batch):
        if runner.talker_step.bucket(batch) is None:
            eager_forwards.append(batch.num_tokens)
        return original(embeds, batch)

    return talker


def test_padded_talker_step_with_preemption_replays_faithfully(tiny):
    model, tokenizer = tiny
    expected = _staggered(new_engine(model, blocks=40), tokenizer)
    engine = _padded(new_engine(model, blocks=11, mode="allow"))
    run = _staggered(engine, tokenizer)
    assert run.preempted, "the pool was meant to be too small for all three"
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id


@torch.inference_mode()
def test_dummy_tokens_write_only_the_scratch_block(tiny):
    model, _ = tiny
    talker, block, num_blocks = model.talker, 4, 20
    generator = torch.Generator().manual_seed(9)
    pool = torch.randn(talker.kv_pool_shape(num_blocks + 1, block), generator=generator)
    step = PaddedTalkerStep(talker, pool, scratch_block=num_blocks, spec=TalkerGraphSpec(8, 16, 32, capture=False))
    # A mixed step: three decode rows (cached 2, 5, 9 tokens) and a 3-token prefill chunk after 4 cached tokens,
    # in shuffled blocks: 6 tokens, so the 8-token bucket with two dummy tokens.
    tables = torch.tensor([[7, 0, 0], [3, 12, 0], [15, 1, 9], [4, 11, 0]])
    seq_lens = torch.tensor([3, 6, 10, 7])
    positions = torch.tensor([2, 5, 9, 4, 5, 6])
    rows = torch.tensor([0, 1, 2, 3, 3, 3])
    slots = tables[rows, positions // block] * block + positions % block
    batch = AttentionBatch(positions, slots, torch.tensor([0, 1, 2, 3, 6]), seq_lens, tables, max_seq_len=10)
    embeds = torch.randn(6, talker.hidden_size, generator=generator)
    original, eager_pool = pool.clone(), pool.clone()
    expected = talker(embeds, batch, eager_pool)  # the reference kernel
    got = step.run(embeds, batch)
    assert step.bucket(batch) == 8 and list(step.prepared) == [8]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # The tokens' own slots hold what the eager step wrote (the padded matmuls may round differently) ...
    torch.testing.assert_close(pool[:num_blocks], eager_pool[:num_blocks], atol=1e-5, rtol=0)
    # ... every other block is untouched, bit for bit, and the dummy tokens wrote into the scratch block.
    owned = {int(b) for row, n in zip(tables, (1, 2, 3, 2)) for b in row[:n]}
    for other in sorted(set(range(num_blocks)) - owned):
        assert torch.equal(pool[other], original[other]), f"block {other} was written"
    assert not torch.equal(pool[num_blocks], original[num_blocks]), "the dummy tokens wrote their K/V somewhere else"
    too_long = AttentionBatch(torch.arange(33), torch.arange(33), torch.tensor([0, 33]), torch.tensor([33]),
                              torch.zeros((1, 9), dtype=torch.int64))
    with pytest.raises(TalkerBucketError) as raised:
        step.run(torch.zeros(33, talker.hidden_size), too_long)
    assert raised.value.code == "no_talker_bucket" and step.bucket(too_long) is None
    nine = torch.arange(9)  # more sequences than the table has rows (8): the runner steps eagerly instead
    assert step.bucket(AttentionBatch(nine * 0, nine * block, torch.arange(10), nine * 0 + 1, nine[:, None])) is None


def test_buckets_and_spec():
    assert buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets(6) == (1, 2, 4, 6) and buckets(1) == (1,)
    config = EngineConfig(kv_cache_blocks=8, block_size=16, max_model_len=1000, max_num_seqs=12)
    assert TalkerGraphSpec.for_engine(config, torch.device("cpu")) is None  # ignored on the CPU
    assert TalkerGraphSpec.for_engine(config, torch.device("cuda")) == TalkerGraphSpec(12, 63, 2048)
    assert TalkerGraphSpec.for_engine(EngineConfig(kv_cache_blocks=8, cuda_graphs=False), torch.device("cuda")) is None
    with pytest.raises(ConfigError, match="cuda_graphs"):
        EngineConfig(kv_cache_blocks=8, cuda_graphs="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_engine_equals_eager_on_cuda(tiny_checkpoint):
    from services.model.loader import load_model
    from services.model.text_tokenizer import TextTokenizer

    model, tokenizer = load_model(tiny_checkpoint, device=torch.device("cuda")), TextTokenizer.from_dir(tiny_checkpoint)
    graphed = new_engine(model, blocks=40)  # cuda_graphs defaults on
    run = _staggered(graphed, tokenizer)
    assert set(graphed.runner.talker_step.prepared) == set(graphed.runner.talker_step.token_buckets)
    eager = new_engine(model, blocks=40)
    eager.runner.talker_step = None
    expected = _staggered(eager, tokenizer)
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id
