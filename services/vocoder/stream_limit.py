"""How many requests one vocoder voices at once (`max_streams`), and what `voxmesh up` gives it for decode's batch."""

from __future__ import annotations

DEFAULT_MAX_STREAMS = 64
"""The vocoder's `--max-streams` unless told otherwise: as many as decode's default batch (`--max-num-seqs`)."""


def streams_for_decode(max_num_seqs: int | None) -> int | None:
    """The `max_streams` a vocoder needs beside a decode replica of `max_num_seqs` (None: its default will do).

    A request decode runs past the vocoder's limit waits on CODES unvoiced while its frames pile up, and its listener
    hears a gap: a mesh started for a batch larger than the default raises the limit with it."""
    if max_num_seqs is None or max_num_seqs <= DEFAULT_MAX_STREAMS:
        return None
    return max_num_seqs
