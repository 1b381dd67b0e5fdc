"""How a codec call's chunks become padded passes: buckets, rounds, and the cheapest grouping of a round."""

from __future__ import annotations

import random

import pytest

from services.model.codec.pass_plan import (PASS_COST, ROW_COST, bucket_of, frame_buckets, max_rows, plan_round,
                                            rounds, row_buckets, shape_buckets)

ROWS, FRAMES = shape_buckets(32, 8), frame_buckets(8)


def _cost(groups: list[list[int]], lengths: list[int]) -> float:
    """Row-frames of running `groups` as padded passes (the model `plan_round` minimises)."""
    frames = [bucket_of(FRAMES, max(lengths[i] for i in g)) for g in groups]
    return sum(PASS_COST + bucket_of(ROWS[n], len(g)) * (ROW_COST + n) for g, n in zip(groups, frames))


def test_buckets():
    assert row_buckets(1) == (1,) and row_buckets(4) == (1, 2, 4) and row_buckets(12) == (1, 2, 4, 8, 12)
    assert row_buckets(32) == (1, 2, 4, 8, 16, 24, 32)
    assert row_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert frame_buckets(1) == (1,) and frame_buckets(8) == (1, 2, 4, 8) and frame_buckets(6) == (1, 2, 4, 6)
    assert row_buckets(32, step=4) == (1, 2, 4, 8, 12, 16, 20, 24, 28, 32)
    assert ROWS == {1: row_buckets(32), 2: row_buckets(32), 4: row_buckets(32, 4), 8: row_buckets(32, 4)}
    assert max_rows(ROWS) == 32 and shape_buckets(6, 2) == {1: (1, 2, 4, 6), 2: (1, 2, 4, 6)}
    assert bucket_of(ROWS[2], 17) == 24 and bucket_of(ROWS[8], 17) == 20 and bucket_of(FRAMES, 3) == 4
    with pytest.raises(ValueError):
        row_buckets(0)
    with pytest.raises(ValueError):
        row_buckets(8, step=0)
    with pytest.raises(ValueError):
        frame_buckets(0)


def test_rounds_keep_a_streams_chunks_in_order_and_skip_empty_ones():
    assert rounds(["a", "b", "a", "c", "a"], [2, 8, 4, 0, 8]) == [[0, 1], [2], [4]]
    assert rounds([], []) == []


def test_a_ramp_of_lengths_at_load_shares_one_pass():
    """A call at 64 streams: first chunks (2), second (2), third (4) and 8-frame chunks: one pass, not three."""
    lengths = [2] * 4 + [4] * 2 + [8] * 11
    assert [sorted(lengths[i] for i in g) for g in plan_round(lengths, ROWS, FRAMES)] == [sorted(lengths)]


def test_many_short_chunks_keep_a_pass_of_their_own_shorter_first():
    """Padding 31 one-frame chunks to 8 frames costs more than a pass: they run alone, first."""
    lengths = [8] + [1] * 31
    groups = plan_round(lengths, ROWS, FRAMES)
    assert [[lengths[i] for i in g] for g in groups] == [[1] * 31, [8]]


def test_a_round_wider_than_the_largest_bucket_is_cut_into_full_passes():
    lengths = [8] * 70
    groups = plan_round(lengths, ROWS, FRAMES)
    assert [len(g) for g in groups] == [32, 32, 6]
    assert sorted(i for g in groups for i in g) == list(range(70))


def test_the_plan_is_never_costlier_than_a_pass_per_length():
    generator = random.Random(7)
    for _ in range(300):
        lengths = [generator.randint(1, 8) for _ in range(generator.randint(1, 40))]
        groups = plan_round(lengths, ROWS, FRAMES)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(len(g) <= 32 for g in groups)
        longest = [max(lengths[i] for i in g) for g in groups]
        assert longest == sorted(longest), "shorter passes first"
        per_length = [[i for i in range(len(lengths)) if lengths[i] == n][at:at + 32]
                      for n in sorted(set(lengths)) for at in range(0, 40, 32)]
        assert _cost(groups, lengths) <= _cost([g for g in per_length if g], lengths)


def test_urgent_chunks_run_first_in_a_pass_of_their_own():
    """A first chunk (one frame) among a full round of 8-frame chunks: by cost alone it is padded into their pass and
    waits for all of it; marked urgent it runs alone, before them. Unmarked chunks are planned as before."""
    lengths = [8] * 20 + [1] + [8] * 10
    assert [sorted(lengths[i] for i in g) for g in plan_round(lengths, ROWS, FRAMES)] == [sorted(lengths)]
    urgent = [False] * 20 + [True] + [False] * 10
    groups = plan_round(lengths, ROWS, FRAMES, urgent)
    assert groups[0] == [20] and sorted(i for g in groups[1:] for i in g) == [i for i in range(31) if i != 20]
    assert plan_round(lengths, ROWS, FRAMES, [False] * 31) == plan_round(lengths, ROWS, FRAMES)


def test_urgent_chunks_share_their_own_passes_shorter_first():
    lengths = [8, 2, 8, 1, 2, 4]
    urgent = [False, True, False, True, True, False]
    groups = plan_round(lengths, ROWS, FRAMES, urgent)
    hurried = [i for g in groups if all(urgent[i] for i in g) for i in g]
    assert sorted(hurried) == [1, 3, 4] and all(urgent[i] for i in groups[0])
    assert [i for g in groups[-1:] for i in g if urgent[i]] == [], "the urgent passes come before the others"
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_a_round_of_urgent_chunks_only_is_planned_as_without_marks():
    for lengths in ([1], [1, 2, 2], [8] * 40):
        assert plan_round(lengths, ROWS, FRAMES, [True] * len(lengths)) == plan_round(lengths, ROWS, FRAMES)
