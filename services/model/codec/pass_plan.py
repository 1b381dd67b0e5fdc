"""How one codec call's chunks are grouped into padded forward passes: few passes, little padding.

A pass runs a fixed (rows, frames) shape: rows padded up to a row bucket with rows that touch no stream, and each
chunk padded at its end up to the pass's frame bucket (every layer of the codec is causal, so a chunk's own samples
and the state it leaves never see its padding). A pass costs a fixed amount whatever it holds (its ~1,000 kernel
launches) plus an amount per row and per row-frame; `PASS_COST` and `ROW_COST` state the first two in row-frames, so
a short chunk in a pass of its own costs as much as many padded frames in a pass that runs anyway. So the chunks of
one round (each stream's next chunk) share passes where that is cheaper than passes of their own, which at load is
nearly always: the decode service's chunk ramp (2, 2, 4, then 8 frames) would otherwise put three lengths, three
passes, into most calls.

Row buckets are finer for the long passes: a padded row of an 8-frame pass costs ten row-frames, of a 2-frame pass
four, so the passes of 4 frames and more step by 4 rows past 8 (a call of 11 chunks pads to 12, not 16) and the short
ones by 8, which keeps the captured shapes few (34 at 32 rows, 8 frames).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence

PASS_COST = 90.0
"""A pass's fixed cost, in row-frames: the time of a graphed pass of one row over the time one more row-frame adds
(`loadtest/gpu/gpu_codec_slots.py` gives both)."""
ROW_COST = 2.0
"""A row's cost beyond its frames, in row-frames (the same ratio for one more row)."""

FINE_ROWS_FROM_FRAMES = 4
"""Passes of this many frames or more get the finer row buckets (`shape_buckets`)."""

RowBuckets = Mapping[int, Sequence[int]]
"""Each frame bucket's row buckets: the (rows, frames) shapes a pass may take."""


def row_buckets(max_rows: int, step: int = 8) -> tuple[int, ...]:
    """Row counts a pass is padded up to: 1, 2, 4, 8, then every multiple of `step` below `max_rows`, then
    `max_rows` (finer than powers of two where a padded row costs most: 17 rows pad to 24, not 32)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    small = [size for size in (1, 2, 4) if size < max_rows]
    return (*small, *range(8, max_rows, step), max_rows)


def shape_buckets(max_rows: int, max_frames: int) -> dict[int, tuple[int, ...]]:
    """Every frame bucket's row buckets: by 4 rows past 8 for passes of `FINE_ROWS_FROM_FRAMES` frames or more,
    by 8 for shorter ones."""
    return {frames: row_buckets(max_rows, 4 if frames >= FINE_ROWS_FROM_FRAMES else 8)
            for frames in frame_buckets(max_frames)}


def frame_buckets(max_frames: int) -> tuple[int, ...]:
    """Frame counts a pass is padded up to: powers of two below `max_frames`, then `max_frames` (1, 2, 4, 8)."""
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    buckets, size = [], 1
    while size < max_frames:
        buckets.append(size)
        size *= 2
    return (*buckets, max_frames)


def bucket_of(buckets: Sequence[int], size: int) -> int:
    """The smallest bucket that holds `size`."""
    return next(bucket for bucket in buckets if bucket >= size)


def rounds(streams: Sequence[Hashable], lengths: Sequence[int]) -> list[list[int]]:
    """A call's rows by round: round r holds each stream's r-th non-empty chunk, so a stream listed twice advances
    in order. `streams[row]` names the stream a row belongs to."""
    by_round: list[list[int]] = []
    seen: dict[Hashable, int] = defaultdict(int)
    for row, length in enumerate(lengths):
        if length == 0:
            continue
        index = seen[streams[row]]
        seen[streams[row]] += 1
        if index == len(by_round):
            by_round.append([])
        by_round[index].append(row)
    return by_round


def plan_round(lengths: Sequence[int], rows: RowBuckets, frames: Sequence[int],
               urgent: Sequence[bool] = ()) -> list[list[int]]:
    """One round's chunks (`lengths[i]` frames each, at most `frames[-1]`) grouped into passes of at most
    `max_rows(rows)` chunks (`rows`: each frame bucket's row buckets), cheapest first found: the chunks sorted by
    length and cut where the length changes, each group padded to its buckets. Returns the groups in running order,
    shorter chunks first (a request's first chunk is its shortest, and a caller that hands out a pass's audio as it
    ends gets first packets out first).

    Chunks marked `urgent` (a first chunk: its listener has nothing to play yet) are planned apart and run first,
    even where sharing the others' pass would cost less: a one-frame chunk padded into a full 8-frame pass waits for
    all of it, where a pass of its own ends in a fraction of that time."""
    if any(urgent):
        first = [i for i in range(len(lengths)) if urgent[i]]
        rest = [i for i in range(len(lengths)) if not urgent[i]]
        return [[part[member] for member in group] for part in (first, rest) if part
                for group in plan_round([lengths[i] for i in part], rows, frames)]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    cuts = [0] + [at for at in range(1, len(order)) if lengths[order[at]] != lengths[order[at - 1]]] + [len(order)]
    best: list[tuple[float, int]] = [(0.0, 0)]  # for each cut: the least cost of the chunks before it, and its cut
    for end in range(1, len(cuts)):
        best.append(min((best[start][0] + _cost(cuts[end] - cuts[start], lengths[order[cuts[end] - 1]], rows,
                                                frames), start) for start in range(end)))
    groups, end, widest = [], len(cuts) - 1, max_rows(rows)
    while end > 0:
        start = best[end][1]
        group = order[cuts[start]:cuts[end]]
        groups[:0] = [group[at:at + widest] for at in range(0, len(group), widest)]
        end = start
    return groups


def max_rows(rows: RowBuckets) -> int:
    """The most chunks one pass holds (the same for every frame bucket)."""
    return max(buckets[-1] for buckets in rows.values())


def _cost(count: int, longest: int, rows: RowBuckets, frames: Sequence[int]) -> float:
    """Row-frames of `count` chunks of at most `longest` frames in passes of at most `max_rows(rows)` rows."""
    pass_frames = bucket_of(frames, longest)
    buckets = rows[pass_frames]
    full, rest = divmod(count, buckets[-1])
    padded = full * buckets[-1] + (bucket_of(buckets, rest) if rest else 0)
    return (full + (rest > 0)) * PASS_COST + padded * (ROW_COST + pass_frames)
