"""The frame sampler on the graph path: codebook 0 and the code predictor over padded, static buffers.

On the CPU the padded sampler runs eagerly over the same static buffers a CUDA graph replays (buckets,
padding rows, the LRU of keys), so everything but the capture itself is checked here: identical codes to
the plain engine, padding rows that cannot reach real rows, and no host synchronisation inside the step.
The capture runs in the CUDA-only test at the end and in `loadtest/gpu/gpu_step_graphs.py`.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from loadtest.gpu import gpu_step_graphs
from services.engine import model_ops
from services.engine.config import EngineConfig
from services.engine.talker_graphs import TalkerGraphSpec
from services.engine.engine import Engine
from services.engine.predictor_graphs import CAPPED, WHOLE, FrameBucketError, PaddedFrameSampler
from services.engine.runner import ModelRunner
from services.engine.engine_request import EngineRequest
from services.model.attention_batch import AttentionBatch
from services.model.layers import fuse_projections
from services.model.sampling import RowSampling, SamplingParams
from tests.support.engine_helpers import TEXTS, EngineRun, load_tiny, make_request, new_engine, record, refuse_captures

GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0)
PARAMS = [  # (talker, predictor, frames): greedy, default seeded, top-k only, top-p, mixed greedy/sampled
    (GREEDY, GREEDY, 6),
    (SamplingParams(), SamplingParams(), 9),
    (SamplingParams(temperature=0.9, top_k=7), SamplingParams(temperature=1.2, top_k=0, top_p=0.8), 4),
    (SamplingParams(top_p=0.7, repetition_penalty=1.3), GREEDY, 8),
]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _padded(engine: Engine) -> Engine:
    """The engine with its runner rebuilt to pad (and on CUDA graph) talker steps and frame sampling, eagerly."""
    config = engine.config
    spec = TalkerGraphSpec(config.max_num_seqs, -(-config.max_model_len // config.block_size),
                           config.max_num_batched_tokens, capture=False)
    engine.runner = ModelRunner(engine.model, engine.num_blocks, config.block_size, capture_hidden=True, graphs=spec)
    return engine


def _admit(engine: Engine, tokenizer, index: int) -> None:
    talker, predictor, frames = PARAMS[index]
    request = make_request(tokenizer, TEXTS[index], ("ryan", "vivian", "eric", "ryan")[index])
    assert engine.add_request(EngineRequest(
        str(index), request, 300 + index, talker, frames, predictor_params=predictor, ignore_eos=True)) is None


def _staggered(engine: Engine, tokenizer) -> EngineRun:
    """Four requests joining on steps 0, 2, 3 and 7 and leaving after 4-9 frames: batches of 1 to 4 rows."""
    arrivals = {0: 0, 2: 1, 3: 2, 7: 3}
    run = EngineRun()
    while run.steps < 8 or engine.has_unfinished():
        if run.steps in arrivals:
            _admit(engine, tokenizer, arrivals[run.steps])
        record(run, engine)
        assert run.steps < 200
    return run


@pytest.mark.parametrize("fused", [False, True], ids=["separate-projections", "fused-projections"])
def test_padded_sampler_gives_the_plain_engine_codes(tiny_checkpoint, fused):
    model, tokenizer = load_tiny(tiny_checkpoint)
    if fused:  # as the loader does on CUDA
        fuse_projections(model.talker)
        fuse_projections(model.code_predictor)
    expected = _staggered(new_engine(model, blocks=60), tokenizer)
    engine = _padded(new_engine(model, blocks=60))
    run = _staggered(engine, tokenizer)
    assert sorted(run.codes) == sorted(expected.codes) == ["0", "1", "2", "3"]
    for request_id, (_, _, frames) in zip("0123", PARAMS):
        assert run.stacked(request_id).shape == (frames, 16)
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id
    assert len(set(expected.stacked("1")[:, 1].tolist())) > 2, "degenerate output proves nothing"
    sampler = engine.runner.frame_sampler
    buckets_used = {key[0] for key in sampler.graphs}
    assert {1, 2, 4} <= buckets_used, buckets_used  # 3 rows ran in the 4-row bucket: one padding row
    assert len(sampler.graphs) > len(buckets_used), "mixed sampling should have made several keys per bucket"


def _inputs(model, rows: int, params: list[tuple[SamplingParams, SamplingParams]], seed: int):
    """Random sample_frames arguments for `rows` rows (hidden, seen, frame counts, penalties, row samplings)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.talker.vocab_size
    hidden = torch.randn(rows, model.talker.hidden_size, generator=generator)
    seen = torch.rand(rows, vocab, generator=generator) < 0.05
    frames = torch.randint(0, 30, (rows,), generator=generator)
    seeds = [1000 + seed * 10 + row for row in range(rows)]
    talker = RowSampling.build([p[0] for p in params], seeds, frames.tolist())
    predictor = RowSampling.build([p[1] for p in params], seeds, frames.tolist(), keys=talker.keys)
    penalty = torch.tensor([p[0].repetition_penalty for p in params])
    return hidden, seen, frames, penalty, talker, predictor, torch.full((rows,), 2)


@torch.inference_mode()
def test_padding_rows_cannot_reach_real_rows(tiny):
    model, _ = tiny
    sampler = PaddedFrameSampler(model, max_rows=8, capture=False)
    mixed = [(SamplingParams(), SamplingParams(top_k=5)), (GREEDY, SamplingParams()),
             (SamplingParams(top_p=0.6), GREEDY)]
    args = _inputs(model, 3, mixed, seed=1)
    expected = model_ops.sample_frames(model, *args)
    # A 4-row step leaves a real-looking row 3 behind; then row 3 is poisoned outright: NaN hidden state,
    # every id seen, a huge penalty. A cross-row operation would carry the NaN into the real rows.
    sampler.run(*_inputs(model, 4, [mixed[0]] * 4, seed=2))
    sampler.hidden[3], sampler.seen[3], sampler.floats[3] = float("nan"), True, 1e6
    got = sampler.run(*args)
    assert list(sampler.graphs)[-1][0] == 4 and got.shape == (3, 16)
    assert torch.equal(got, expected)
    assert bool(torch.isnan(sampler.hidden[3]).all()), "the poison must still be there for the check to mean anything"
    # The same rows at a different batch position give the same codes (no row sees another).
    reordered = _inputs(model, 3, mixed, seed=1)
    flipped = [t.flip(0) if isinstance(t, torch.Tensor) else t.select(torch.tensor([2, 1, 0])) for t in reordered]
    assert torch.equal(sampler.run(*flipped).flip(0), expected)


@torch.inference_mode()
def test_every_sampling_mix_shares_one_graph_per_bucket(tiny):
    model, _ = tiny
    sampler = PaddedFrameSampler(model, max_rows=4, capture=False)
    greedy, sampled, top_p = [(GREEDY, GREEDY)] * 2, [(SamplingParams(), SamplingParams())] * 2, \
        [(SamplingParams(top_p=0.5), GREEDY)] * 2
    mixed = [(GREEDY, SamplingParams(top_k=9)), (SamplingParams(temperature=1.3, repetition_penalty=1.4), GREEDY)]
    for params in (greedy, sampled, greedy, top_p, mixed):
        args = _inputs(model, 2, params, seed=3)
        assert torch.equal(sampler.run(*args), model_ops.sample_frames(model, *args))
    assert list(sampler.graphs) == [(2, CAPPED, CAPPED)] and sampler.captures == 1
    # A row that keeps more candidates than the cap (top_k 0: the whole vocabulary) takes the key's other graph.
    whole = [(SamplingParams(), SamplingParams(top_k=0)), (GREEDY, GREEDY)]
    args = _inputs(model, 2, whole, seed=5)
    assert torch.equal(sampler.run(*args), model_ops.sample_frames(model, *args))
    assert list(sampler.graphs)[-1] == (2, CAPPED, WHOLE)
    sampler.prepare_all()
    # On the CPU the fused sampler never serves: the four mixes of the top-p modes a bucket.
    assert len(sampler.graphs) == 4 * len(sampler.row_buckets) == 12 and sampler.captures == 12
    with pytest.raises(FrameBucketError) as raised:
        sampler.run(*_inputs(model, 5, [(GREEDY, GREEDY)] * 5, seed=4))
    assert raised.value.code == "no_frame_bucket" and sampler.bucket(5) is None and sampler.bucket(3) == 4


@torch.inference_mode()
def test_graphs_are_capped_least_recently_used_first(tiny):
    model, _ = tiny
    sampler = PaddedFrameSampler(model, max_rows=4, capture=False, max_graphs=2)
    capped, whole = [(GREEDY, GREEDY)] * 2, [(SamplingParams(top_k=0), GREEDY)] * 2
    for rows, params in ((2, capped), (2, whole), (2, capped), (4, capped * 2)):
        args = _inputs(model, rows, params, seed=3)
        assert torch.equal(sampler.run(*args), model_ops.sample_frames(model, *args))
    # (2, capped) was used again after (2, whole), so (2, whole) is the one evicted when 4 rows came.
    assert list(sampler.graphs) == [(2, CAPPED, CAPPED), (4, CAPPED, CAPPED)] and sampler.captures == 3


@torch.inference_mode()
def test_a_failed_capture_runs_every_step_eagerly_and_is_counted(tiny, monkeypatch, caplog):
    model, _ = tiny
    engine = _padded(new_engine(model, blocks=60))
    runner, sampler = engine.runner, engine.runner.frame_sampler
    sampler.graph_capture.is_capturing = True  # as on CUDA, with no device here: the capture is what fails
    attempts = refuse_captures(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="services.engine.predictor_graphs"):
        runner.prepare_graphs()
    # Tried once, then never again (a failed capture can leave the graph pool unusable); every key still prepared.
    assert len(attempts) == 1 and not sampler.graph_capture.is_capturing
    assert sampler.captures == len(sampler.graphs) == 4 * len(sampler.row_buckets)
    assert sampler.num_capture_failures == runner.num_capture_failures == 1
    [failure] = [r for r in caplog.records if r.name == "services.engine.predictor_graphs"]
    assert "the sampling step (rows bucket 1, talker capped, predictor capped) failed" in failure.getMessage()
    assert failure.exc_info is not None, "the capture's error is in the log"
    mixed = [(SamplingParams(), SamplingParams(top_k=5)), (GREEDY, SamplingParams(top_p=0.7)), (GREEDY, GREEDY)]
    args = _inputs(model, 3, mixed, seed=6)
    assert torch.equal(sampler.run(*args), model_ops.sample_frames(model, *args))


class HostSync(AssertionError):
    """Raised by the patched tensor-to-host conversions."""


SYNCING = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__")


@contextmanager
def _no_host_reads(monkeypatch):
    """Every tensor-to-Python conversion raises inside the scope (each one would be a device sync on CUDA)."""
    with monkeypatch.context() as patch:
        for name in SYNCING:
            def refuse(self, *args, _name=name, **kwargs):
                raise HostSync(f"Tensor.{_name} called inside the graphed region")
            patch.setattr(torch.Tensor, name, refuse)
        yield


def _guarded(step, monkeypatch, calls: list[int]):
    def run():
        with _no_host_reads(monkeypatch):
            output = step()
        calls.append(1)
        return output
    return run


def test_padded_step_reads_nothing_back_from_the_device(tiny, monkeypatch):
    model, tokenizer = tiny
    engine = _padded(new_engine(model, blocks=60))
    for index in range(3):
        _admit(engine, tokenizer, index)
    run = EngineRun()
    for _ in range(3):  # prefill, then decode steps: every bucket used below is prepared (warm)
        record(run, engine)
    runner, calls = engine.runner, []
    for key, bucket in runner.talker_step.prepared.items():
        runner.talker_step.prepared[key] = replace(bucket, step=_guarded(bucket.step, monkeypatch, calls))
    for key, step in runner.frame_sampler.graphs.items():
        runner.frame_sampler.graphs[key] = _guarded(step, monkeypatch, calls)
    out = record(run, engine)
    assert len(out.frames) == 3 and len(calls) == 2, "the talker step and the sampler step both ran guarded"
    # The probe works: the reference attention kernel (prefill) reads lengths back, and fails under it.
    batch = AttentionBatch(torch.arange(3), torch.arange(3), torch.tensor([0, 3]), torch.tensor([3]),
                           torch.tensor([[0]]), max_seq_len=3)
    pool = torch.zeros(model.talker.kv_pool_shape(2, 4))
    with pytest.raises(HostSync), torch.inference_mode(), _no_host_reads(monkeypatch):
        model.talker(torch.zeros(3, model.talker.hidden_size), batch, pool)


def test_step_graphs_script_runs_on_cpu(tmp_path):
    out = tmp_path / "step_graphs.json"
    rc = gpu_step_graphs.main(["--out", str(out), "--device", "cpu", "--tiny", "--batch-sizes", "1", "3",
                               "--steps", "2", "--warmup", "1", "--commit", "test"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == [] and report["verdict"] == {"codes_equal": True, "sampler_equal": True}
    assert [row["batch"] for row in report["results"]] == [1, 3]
    row = report["results"][1]
    assert row["codes_equal"] and row["graph_mode"] == "padded eager (no CUDA)"
    assert row["eager"]["median_ms"] > 0 and row["graphs"]["median_ms"] > 0
    assert row["sampler_buckets"] == [4] and row["talker_buckets"]
    assert row["sampler_equal"] == {"equal": True, "rows_mismatched": 0, "bucket": 4}
    assert gpu_step_graphs.table(report["results"])[-1].startswith("| 3 |")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_sampler_equals_eager_on_cuda(tiny_checkpoint):
    from services.model.loader import load_model
    from services.model.text_tokenizer import TextTokenizer

    model, tokenizer = load_model(tiny_checkpoint, device=torch.device("cuda")), TextTokenizer.from_dir(tiny_checkpoint)
    graphed = new_engine(model, blocks=60)  # cuda_graphs defaults on
    run = _staggered(graphed, tokenizer)
    assert {1, 2, 4} <= {key[0] for key in graphed.runner.frame_sampler.graphs}
    # Against the same padded shapes run eagerly: the capture is what is checked here. That padding changes no
    # code is proven on the CPU (test_padded_sampler_gives_the_plain_engine_codes); on CUDA a float32 GEMM of 3 rows
    # and one of 4 may round differently (cuBLAS picks kernels by shape), so unpadded runs need not match bit for bit.
    eager = _padded(new_engine(model, blocks=60))
    expected = _staggered(eager, tokenizer)
    for request_id in expected.codes:
        assert torch.equal(run.stacked(request_id), expected.stacked(request_id)), request_id


def test_engine_config_keeps_graphs_off_on_cpu(tiny):
    model, _ = tiny
    engine = Engine(model, EngineConfig(kv_cache_blocks=8, block_size=4, max_num_seqs=4))
    assert engine.runner.frame_sampler is None and engine.runner.talker_step is None


@torch.inference_mode()
def test_the_eager_part_of_slot_sampling_runs_at_start_up_once_for_each_row_count_class(tiny, monkeypatch):
    """Triton compiles `fused_row_keys` at its first launch with one row, with a multiple of 16 and with any other
    count: preparing the graphs runs the sampling's eager part once with each, so no request's step pays for it."""
    model, _ = tiny
    engine = _padded(new_engine(model, blocks=60, max_num_seqs=16))
    runner, sampler = engine.runner, engine.runner.frame_sampler
    counts = []
    run_from_slots = sampler.run_from_slots

    def counted(hidden, index, *args):
        counts.append((hidden.shape[0], index.shape[0], index.stride()))
        return run_from_slots(hidden, index, *args)

    monkeypatch.setattr(sampler, "run_from_slots", counted)
    runner.prepare_graphs()
    assert [count for count, _, _ in counts] == [1, 2, 16]
    assert all(rows == count and stride == (3, 1) for count, rows, stride in counts), "laid out as launch's index"
    assert not runner.seen._slots, "no penalty row was taken"
