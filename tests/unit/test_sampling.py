"""Keyed, batched sampling: greedy, top-k/top-p, distribution, and independence from the batch."""

from __future__ import annotations

import pytest
import torch

from services.model.sampling import (
    RowSampling,
    SamplingParams,
    SamplingParamsError,
    apply_repetition_penalty,
    keyed_uniform,
    sample,
)


def _rows(params: list[SamplingParams], seeds: list[int], frames: list[int]) -> RowSampling:
    return RowSampling.build(params, seeds, frames)


def test_greedy_rows_take_the_argmax() -> None:
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(0))
    rows = _rows([SamplingParams(temperature=0.0)] * 8, list(range(8)), [3] * 8)
    assert torch.equal(sample(logits, rows, codebook=0), logits.argmax(dim=1))


def test_greedy_rows_stay_greedy_in_a_mixed_batch() -> None:
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=0)] * 3
    drawn = sample(logits, _rows(params, [7] * 6, [0] * 6), codebook=2)
    greedy_rows = torch.tensor([0, 2, 4])
    assert torch.equal(drawn[greedy_rows], logits.argmax(dim=1)[greedy_rows])


def _mixed_batch(num_rows: int) -> tuple[torch.Tensor, list[SamplingParams], list[int], list[int]]:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(num_rows, 257, generator=gen) * 3
    choices = [
        SamplingParams(temperature=0.9, top_k=50, top_p=1.0),
        SamplingParams(temperature=1.3, top_k=0, top_p=0.8),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.6, top_k=5, top_p=0.5),
    ]
    params = [choices[i % len(choices)] for i in range(num_rows)]
    seeds = [1000 + 17 * i for i in range(num_rows)]
    frames = [i % 7 for i in range(num_rows)]
    return logits, params, seeds, frames


def test_a_row_draws_the_same_token_whatever_the_batch() -> None:
    logits, params, seeds, frames = _mixed_batch(48)
    full = sample(logits, _rows(params, seeds, frames), codebook=4)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(3))
    permuted = sample(logits[order], _rows([params[i] for i in order], [seeds[i] for i in order],
                                           [frames[i] for i in order]), codebook=4)
    assert torch.equal(permuted, full[order])
    for i in (0, 5, 13, 47):
        alone = sample(logits[i : i + 1], _rows([params[i]], [seeds[i]], [frames[i]]), codebook=4)
        assert int(alone) == int(full[i])
    subset = torch.tensor([3, 9, 10, 40, 41])
    sub = sample(logits[subset], _rows([params[i] for i in subset], [seeds[i] for i in subset],
                                       [frames[i] for i in subset]), codebook=4)
    assert torch.equal(sub, full[subset])


def test_every_key_field_changes_the_noise() -> None:
    seed = torch.tensor([5, 5, 6, 5, 2**62 + 5])
    frame = torch.tensor([0, 1, 0, 0, 0])
    base = keyed_uniform(seed, frame, codebook=0, vocab_size=512)
    other_codebook = keyed_uniform(seed[:1], frame[:1], codebook=1, vocab_size=512)
    rows = [base[0], base[1], base[2], other_codebook[0], base[4]]
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            assert not torch.equal(rows[i], rows[j]), (i, j)
    assert float(base.min()) > 0.0 and float(base.max()) < 1.0
    again = keyed_uniform(seed, frame, codebook=0, vocab_size=512)
    assert torch.equal(base, again)


def test_different_keys_draw_different_tokens_from_a_flat_distribution() -> None:
    num_rows = 200
    logits = torch.zeros(num_rows, 1024)
    params = [SamplingParams(temperature=1.0, top_k=0)] * num_rows
    by_frame = sample(logits, _rows(params, [42] * num_rows, list(range(num_rows))), codebook=0)
    by_seed = sample(logits, _rows(params, list(range(num_rows)), [0] * num_rows), codebook=0)
    by_codebook = torch.stack(
        [sample(logits[:1], _rows(params[:1], [42], [0]), codebook=c)[0] for c in range(16)]
    )
    assert len(set(by_frame.tolist())) > 150
    assert len(set(by_seed.tolist())) > 150
    assert len(set(by_codebook.tolist())) > 12


def _allowed_tokens(row_logits: torch.Tensor, params: SamplingParams) -> set[int]:
    """Straightforward per-row top-k then top-p, written independently of the batched code."""
    scaled = row_logits / params.temperature
    order = scaled.argsort(descending=True).tolist()
    if params.top_k:
        order = order[: params.top_k]
    probs = torch.softmax(scaled[order], dim=0).tolist()
    kept, mass = [], 0.0
    for token, p in zip(order, probs):
        kept.append(token)
        mass += p
        if params.top_p < 1.0 and mass >= params.top_p - 1e-6:
            break
    return set(kept)


def test_draws_never_leave_the_top_k_top_p_set() -> None:
    gen = torch.Generator().manual_seed(4)
    choices = [SamplingParams(temperature=1.0, top_k=3, top_p=1.0), SamplingParams(temperature=0.7, top_k=0, top_p=0.6),
               SamplingParams(temperature=2.0, top_k=10, top_p=0.9), SamplingParams(temperature=1.0, top_k=1)]
    num_rows = 400
    logits = torch.randn(num_rows, 64, generator=gen) * 2
    params = [choices[i % 4] for i in range(num_rows)]
    drawn = sample(logits, _rows(params, list(range(num_rows)), [9] * num_rows), codebook=3).tolist()
    for i, token in enumerate(drawn):
        assert token in _allowed_tokens(logits[i], params[i]), (i, params[i])
    top1 = [drawn[i] for i in range(3, num_rows, 4)]
    assert top1 == [int(logits[i].argmax()) for i in range(3, num_rows, 4)]


def _empirical(logits: torch.Tensor, params: SamplingParams, num_keys: int) -> torch.Tensor:
    batch = logits.expand(num_keys, -1)
    drawn = sample(batch, _rows([params] * num_keys, list(range(num_keys)), [11] * num_keys), codebook=5)
    return torch.bincount(drawn, minlength=logits.shape[1]).double() / num_keys


def test_draws_follow_softmax_of_logits_over_temperature() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0]])
    freq = _empirical(logits, SamplingParams(temperature=0.7, top_k=0), num_keys=40_000)
    expected = torch.softmax(logits[0].double() / 0.7, dim=0)
    # Standard error of a proportion here is at most sqrt(0.25 / 40000) = 0.0025.
    assert torch.allclose(freq, expected, atol=0.012), (freq, expected)


def test_top_k_and_top_p_renormalise_over_the_kept_tokens() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0]])
    freq_k = _empirical(logits, SamplingParams(temperature=1.0, top_k=3), num_keys=30_000)
    expected_k = torch.zeros(6, dtype=torch.float64)
    expected_k[:3] = torch.softmax(logits[0, :3].double(), dim=0)
    assert torch.allclose(freq_k, expected_k, atol=0.012), freq_k
    # softmax([2, 1, 0.5, ...]) = 0.48, 0.18, 0.11, ...: top_p 0.6 keeps the first two.
    freq_p = _empirical(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.6), num_keys=30_000)
    expected_p = torch.zeros(6, dtype=torch.float64)
    expected_p[:2] = torch.softmax(logits[0, :2].double(), dim=0)
    assert torch.allclose(freq_p, expected_p, atol=0.012), freq_p


def test_suppressed_tokens_are_never_drawn() -> None:
    logits = torch.zeros(500, 10)
    logits[:, 5:] = float("-inf")
    drawn = sample(logits, _rows([SamplingParams(temperature=1.0, top_k=0)] * 500, list(range(500)), [0] * 500), 1)
    assert int(drawn.max()) < 5


def test_seeds_above_two_to_the_63_are_accepted_and_distinct() -> None:
    rows = _rows([SamplingParams()] * 2, [2**64 - 1, 2**63 - 1], [0, 0])
    assert rows.seed.tolist() == [-1, 2**63 - 1]
    noise = keyed_uniform(rows.seed, rows.frame, codebook=0, vocab_size=32)
    assert not torch.equal(noise[0], noise[1])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": "1.1"}, "repetition_penalty"),
    ],
)
def test_bad_params_raise_a_clear_value_error(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        SamplingParams(**kwargs)
    assert info.value.code == "invalid_sampling_params"


def test_bad_batch_inputs_raise() -> None:
    with pytest.raises(SamplingParamsError, match="equal lengths"):
        RowSampling.build([SamplingParams()] * 2, [1], [0, 0])
    with pytest.raises(SamplingParamsError, match="frame"):
        RowSampling.build([SamplingParams()], [1], [-1])
    with pytest.raises(SamplingParamsError, match="64 bits"):
        RowSampling.build([SamplingParams()], [2**64], [0])
    rows = _rows([SamplingParams()] * 2, [1, 2], [0, 0])
    with pytest.raises(SamplingParamsError, match=r"\[B, V\]"):
        sample(torch.zeros(3, 10), rows, codebook=0)
    with pytest.raises(SamplingParamsError, match="codebook"):
        sample(torch.zeros(2, 10), rows, codebook=-1)


def test_select_keeps_the_chosen_rows() -> None:
    rows = _rows([SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)], [3, 4], [1, 2])
    picked = rows.select(torch.tensor([False, True]))
    assert picked.seed.tolist() == [4] and picked.frame.tolist() == [2] and picked.temperature.tolist() == [0.0]


def test_repetition_penalty_follows_the_sign_of_the_logit() -> None:
    logits = torch.tensor([[2.0, -2.0, 3.0], [2.0, -2.0, 3.0]])
    seen = torch.tensor([[True, True, False], [True, True, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0, 1.0]))
    assert out.tolist() == [[1.0, -4.0, 3.0], [2.0, -2.0, 3.0]]


def test_hand_built_rows_without_host_summaries_draw_the_same() -> None:
    logits, params, seeds, frames = _mixed_batch(16)
    built = _rows(params, seeds, frames)
    bare = RowSampling(built.temperature, built.top_k, built.top_p, built.seed, built.frame)
    for codebook in (0, 7):
        assert torch.equal(sample(logits, bare, codebook), sample(logits, built, codebook))


def test_reused_keys_draw_like_fresh_ones() -> None:
    logits, params, seeds, frames = _mixed_batch(12)
    fresh = _rows(params, seeds, frames)
    reused = RowSampling.build(params, seeds, frames, keys=fresh.keys)
    assert torch.equal(sample(logits, reused, 3), sample(logits, fresh, 3))


def test_row_keys_are_the_same_bits_from_numpy_tensors_and_python_ints():
    """The host computes the keys with numpy (cheaper per operation than torch on small arrays); every path must
    give the bits the per-row Python-int definition gives, or a replay on another replica would draw differently."""
    from services.model import sampling

    generator = torch.Generator().manual_seed(7)
    seed = torch.randint(-(2**63), 2**63 - 1, (257,), dtype=torch.int64, generator=generator)
    frame = torch.randint(0, 1 << 20, (257,), dtype=torch.int64, generator=generator)
    on_host = sampling.row_keys(seed, frame)
    as_tensors = torch.stack(sampling._key_lanes(seed, frame), dim=1)
    by_ints = torch.tensor([[int(lane) for lane in sampling._key_lanes(int(s), int(f))]
                            for s, f in zip(seed.tolist(), frame.tolist())], dtype=torch.int64)
    assert torch.equal(on_host, as_tensors) and torch.equal(on_host, by_ints)
