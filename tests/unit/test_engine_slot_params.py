"""Sampling from each request's slot: its parameters and penalty row kept on the device, gathered by the graphed
sampler (`PaddedFrameSampler.run_from_slots`), draw what the plain `sample_frames` draws from host-built rows."""

from __future__ import annotations

import pytest
import torch

from services.engine import model_ops
from services.engine.predictor_graphs import CAPPED, WHOLE, PaddedFrameSampler, params_mode, sampling_mode
from services.engine.sampler_columns import FRAME, KEYS, MIN_FRAMES, NUM_FRAMES, PREDICTOR_TOP_K, TALKER_TOP_K
from services.engine.sequence import Sequence
from services.engine import slot_params
from services.engine.slot_params import SlotParams
from services.model.sampling import RowSampling, SamplingParams, as_int64, row_keys
from tests.support.engine_helpers import load_tiny

GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0)
MIXED = [  # (talker, predictor, min_new_frames, seed)
    (SamplingParams(), SamplingParams(top_k=5), 2, 2**63 + 5),
    (GREEDY, SamplingParams(temperature=1.3), 40, 7),
    (SamplingParams(top_p=0.6, repetition_penalty=1.4), GREEDY, 2, -3),
]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)[0]


def _seqs(prefix: str, mixed) -> list[Sequence]:
    return [Sequence(f"{prefix}{row}", 4, seed, talker, 100, predictor_params=predictor, min_new_frames=least)
            for row, (talker, predictor, least, seed) in enumerate(mixed)]


def _expected(model, seqs: list[Sequence], hidden, seen_rows, frames: list[int]) -> torch.Tensor:
    seeds = [seq.seed for seq in seqs]
    talker = RowSampling.build([s.params for s in seqs], seeds, frames)
    predictor = RowSampling.build([s.predictor_params for s in seqs], seeds, frames, keys=talker.keys)
    penalty = torch.tensor([s.params.repetition_penalty for s in seqs])
    return model_ops.sample_frames(model, hidden, seen_rows, torch.tensor(frames), penalty, talker, predictor,
                                   torch.tensor([s.min_new_frames for s in seqs]))


def _modes(model, seqs: list[Sequence]) -> tuple[str, str]:
    config, kernels = model.config.talker, model.kernels
    return (params_mode([s.params for s in seqs], config.vocab_size, kernels),
            params_mode([s.predictor_params for s in seqs], config.code_predictor.vocab_size, kernels))


@torch.inference_mode()
def test_rows_sampled_from_their_slots_draw_the_host_built_rows_codes(tiny):
    model = tiny
    generator = torch.Generator().manual_seed(4)
    vocab = model.config.talker.vocab_size
    sampler, params = PaddedFrameSampler(model, max_rows=4, capture=False), SlotParams(6, torch.device("cpu"))
    table = torch.rand(6, vocab, generator=generator) < 0.05
    seqs, slots, frames = _seqs("a", MIXED), [4, 0, 2], [0, 1, 37]
    params.hold(slots, seqs)
    hidden = torch.randn(3, model.talker.hidden_size, generator=generator)
    # A 4-row step first leaves a row behind, which is then poisoned: NaN state, every id seen, a huge penalty.
    params.hold([1, 3, 5, 0], _seqs("b", MIXED * 2)[:4])
    sampler.run_from_slots(torch.randn(4, model.talker.hidden_size, generator=generator),
                           torch.tensor([[1, 5], [3, 6], [5, 7], [0, 8]]), table, params, (CAPPED, CAPPED))
    sampler.hidden[3], sampler.seen[3], sampler.floats[3] = float("nan"), True, 1e6
    params.hold(slots, seqs)  # slot 0 was taken by another request meanwhile: it is written again
    index = torch.tensor(list(zip(slots, frames)))
    got = sampler.run_from_slots(hidden, index, table, params, _modes(model, seqs))
    expected = _expected(model, seqs, hidden, table[slots], frames)
    assert list(sampler.graphs)[-1] == (4, CAPPED, CAPPED) and got.shape == (3, 16)
    assert torch.equal(got, expected)
    # What the step staged for the graph, column by column (a draw need not show a wrong frame count).
    staged = sampler.ints[:3]
    assert staged[:, NUM_FRAMES].tolist() == staged[:, FRAME].tolist() == frames
    seeds = torch.tensor([as_int64(s.seed) for s in seqs])
    assert torch.equal(staged[:, KEYS : KEYS + 2], row_keys(seeds, torch.tensor(frames)))
    assert staged[:, MIN_FRAMES].tolist() == [2, 40, 2] and staged[:, TALKER_TOP_K].tolist() == [50, 50, 50]
    assert staged[:, PREDICTOR_TOP_K].tolist() == [5, 50, 50]
    assert len(set(expected[:, 1:].flatten().tolist())) > 3, "degenerate codes prove nothing"
    # The slot's row, not the batch position, decides: the same rows reversed give the same codes.
    flipped = sampler.run_from_slots(hidden.flip(0), index.flip(0), table, params, _modes(model, seqs))
    assert torch.equal(flipped.flip(0), expected)


@torch.inference_mode()
def test_a_slot_is_written_once_per_request_seated_there(tiny, monkeypatch):
    params = SlotParams(3, torch.device("cpu"))
    writes = []
    original = torch.Tensor.index_copy_
    monkeypatch.setattr(torch.Tensor, "index_copy_",
                        lambda self, dim, index, source: writes.append(index.tolist()) or original(self, dim, index,
                                                                                                  source))
    uploads = []
    monkeypatch.setattr(slot_params, "upload", lambda tensor, device: uploads.append(tensor.shape) or tensor)
    first, second = _seqs("x", MIXED[:2]), _seqs("y", MIXED[2:])
    params.hold([0, 2], first)
    params.hold([0, 2], first)  # seated already: nothing to write
    assert writes == [[0, 2], [0, 2]]  # ints, then floats
    assert len(uploads) == 1, "slots, ints and floats go up together"
    params.vacate(2)
    params.hold([2], second)
    assert writes[2:] == [[2], [2]]
    assert params.ints[2].tolist() == [2, 50, 50, -3] and params.ints[0, 3] == 2**63 + 5 - 2**64
    assert params.floats[2].tolist() == pytest.approx([1.4, 0.9, 0.6, 0.0, 1.0])
    # A request seated again where it sat before, after leaving, is written again (its id might be reused).
    params.vacate(0)
    params.hold([0], first[:1])
    assert writes[4:] == [[0], [0]]


def test_the_mode_read_from_parameters_is_the_mode_of_the_built_rows(tiny):
    model = tiny
    vocab = model.config.talker.vocab_size
    modes = []
    for params in ([GREEDY], [SamplingParams(top_k=0)], [SamplingParams(), SamplingParams(top_p=0.5)],
                   [SamplingParams(top_k=500), GREEDY]):
        rows = RowSampling.build(params, [1] * len(params), [0] * len(params))
        modes.append(params_mode(params, vocab, model.kernels))
        assert modes[-1] == sampling_mode(rows, vocab, model.kernels)
    assert modes == [CAPPED, WHOLE, CAPPED, WHOLE]
