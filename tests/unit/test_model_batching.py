"""The batched entry points the services use: a talker step over a flattened batch that mixes prefill and
decode rows in a shared, non-contiguous paged pool; a batched code-predictor step; the talker's logit
processing against the reference library's own logits processors."""

from __future__ import annotations

import pytest
import torch

from services.model.attention_batch import AttentionBatch
from services.model.loader import load_model
from services.model.talker_logits import TalkerLogitsProcessor
from tests.support.model_fixtures import reference_checkpoint

BLOCK = 4


@pytest.fixture(scope="module")
def model():
    return load_model(reference_checkpoint("custom_voice").directory)


def _batch(rows: list[tuple[int, int, list[int]]]) -> AttentionBatch:
    """rows: (tokens already cached, new tokens, the sequence's blocks)."""
    positions, slots, starts, lens = [], [], [0], []
    width = max(len(blocks) for _, _, blocks in rows)
    for cached, new, blocks in rows:
        for p in range(cached, cached + new):
            positions.append(p)
            slots.append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(starts[-1] + new)
        lens.append(cached + new)
    tables = [blocks + [-1] * (width - len(blocks)) for _, _, blocks in rows]
    return AttentionBatch(torch.tensor(positions), torch.tensor(slots), torch.tensor(starts), torch.tensor(lens), torch.tensor(tables))


def _alone(model, inputs: torch.Tensor) -> torch.Tensor:
    """Hidden states of one sequence run token-group by token-group in its own pool: prefill 5, then singles."""
    blocks = list(range(-(-inputs.shape[0] // BLOCK)))
    pool = torch.zeros(model.talker.kv_pool_shape(len(blocks), BLOCK))
    out = [model.talker(inputs[:5], _batch([(0, 5, blocks)]), pool)]
    for t in range(5, inputs.shape[0]):
        out.append(model.talker(inputs[t : t + 1], _batch([(t, 1, blocks)]), pool))
    return torch.cat(out)


@torch.inference_mode()
def test_mixed_prefill_and_decode_batch_equals_each_sequence_alone(model):
    generator = torch.Generator().manual_seed(1)
    lengths = {"a": 9, "b": 7, "c": 8}
    inputs = {k: torch.randn(n, model.talker.hidden_size, generator=generator) for k, n in lengths.items()}
    expected = {k: _alone(model, x) for k, x in inputs.items()}
    # Shuffled blocks shared by all sequences in one pool; the spare blocks are never touched.
    order = torch.randperm(12, generator=generator).tolist()
    blocks = {"a": order[0:3], "b": order[3:5], "c": order[5:7]}
    pool = torch.full(model.talker.kv_pool_shape(12, BLOCK), float("nan"))
    done = {k: 0 for k in lengths}
    got = {k: [] for k in lengths}
    # step 1: prefill a and b; step 2: prefill c, decode a and b; then decode all, a and c first.
    schedule = [[("a", 5), ("b", 5)], [("a", 1), ("c", 5), ("b", 1)], [("c", 1), ("a", 1)], [("b", 1), ("a", 1), ("c", 1)], [("a", 1), ("c", 1)]]
    for step in schedule:
        batch = _batch([(done[k], n, blocks[k]) for k, n in step])
        hidden = model.talker(torch.cat([inputs[k][done[k] : done[k] + n] for k, n in step]), batch, pool)
        for (k, n), start in zip(step, batch.query_start[:-1].tolist()):
            got[k].append(hidden[start : start + n])
            done[k] += n
    for k in lengths:
        torch.testing.assert_close(torch.cat(got[k]), expected[k], atol=1e-5, rtol=0)
    last = model.talker.last_hidden(hidden, batch)
    torch.testing.assert_close(last, torch.stack([expected["a"][-1], expected["c"][-1]]), atol=1e-5, rtol=0)


@torch.inference_mode()
def test_code_predictor_rows_are_independent(model):
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(5, model.talker.hidden_size, generator=generator)
    first = torch.randint(0, 2048, (5,), generator=generator)
    batched = model.code_predictor.predict(hidden, first)
    alone = torch.cat([model.code_predictor.predict(hidden[i : i + 1], first[i : i + 1]) for i in range(5)])
    assert batched.shape == (5, 15)
    assert torch.equal(batched, alone)


@pytest.mark.parametrize("penalty", [1.0, 1.05, 2.0])
def test_talker_logit_processing_matches_the_reference_processors(model, penalty):
    from transformers.generation.logits_process import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    cfg = model.config.talker
    vocab, eos = cfg.vocab_size, cfg.codec_eos_id
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, vocab, generator=generator) * 5
    history = [[], [7], [7, 7, 300], [eos - 1, 12, 2047, 5]]  # codebook-0 ids each row generated so far
    seen = torch.zeros(4, vocab, dtype=torch.bool)
    for row, ids in enumerate(history):
        seen[row, ids] = True
    process = TalkerLogitsProcessor.for_config(cfg, penalty)
    mine = process(logits, seen, torch.tensor([len(ids) for ids in history]))
    for row, ids in enumerate(history):
        input_ids = torch.tensor([ids], dtype=torch.long).reshape(1, len(ids))
        scores = logits[row : row + 1].clone()
        scores = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, scores) if penalty != 1.0 else scores
        scores = MinNewTokensLengthLogitsProcessor(0, 2, eos)(input_ids, scores)
        suppressed = [i for i in range(vocab - 1024, vocab) if i != eos]
        scores = SuppressTokensLogitsProcessor(suppressed)(input_ids, scores)
        assert torch.equal(mine[row], scores[0]), f"row {row}"
    assert mine[0, eos] == float("-inf") and mine[3, eos] == logits[3, eos]
