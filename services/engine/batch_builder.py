"""Turn a step's scheduled sequences into the flattened `AttentionBatch` the talker reads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from services.engine.outputs import ScheduledSequence
from services.model.attention_batch import AttentionBatch


def build_attention_batch(
    scheduled: list[ScheduledSequence], block_size: int, device: torch.device | str = "cpu"
) -> AttentionBatch:
    """Positions, KV slots and block tables of every new token, in the order of `scheduled`.

    Built on the CPU with numpy (no torch call per sequence: in a serving process each torch call releases and
    retakes the interpreter lock, which the publishing thread competes for) and moved to `device` in one copy each.
    `max_seq_len` is set from host-side numbers, so attention never reads sequence lengths back from the device.
    """
    num_seqs = len(scheduled)
    starts = np.fromiter((item.start for item in scheduled), dtype=np.int64, count=num_seqs)
    counts = np.fromiter((item.num_new_tokens for item in scheduled), dtype=np.int64, count=num_seqs)
    widths = [len(item.seq.block_table) for item in scheduled]
    tables = np.zeros((num_seqs, max(widths)), dtype=np.int64)
    for row, (item, width) in enumerate(zip(scheduled, widths)):
        tables[row, :width] = item.seq.block_table
    query_start = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start[1:])
    row_of_token = np.repeat(np.arange(num_seqs), counts)
    positions = starts[row_of_token] + np.arange(query_start[-1]) - query_start[:-1][row_of_token]
    slot_mapping = tables[row_of_token, positions // block_size] * block_size + positions % block_size
    seq_lens = starts + counts
    return AttentionBatch(
        positions=_on(positions, device),
        slot_mapping=_on(slot_mapping, device),
        query_start=_on(query_start, device),
        seq_lens=_on(seq_lens, device),
        block_tables=_on(tables, device),
        max_seq_len=int(seq_lens.max()),
    )


def _on(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    host = torch.from_numpy(array)
    return host if torch.device(device).type == "cpu" else host.to(device)


def on_device(batch: AttentionBatch, device: torch.device | str) -> AttentionBatch:
    """The same batch with its tensors on `device` (the host-side `max_seq_len` travels along)."""
    return replace(batch, positions=batch.positions.to(device), slot_mapping=batch.slot_mapping.to(device),
                   query_start=batch.query_start.to(device), seq_lens=batch.seq_lens.to(device),
                   block_tables=batch.block_tables.to(device))


def sampling_rows(scheduled: list[ScheduledSequence]) -> list[int]:
    """Indices into `scheduled` of the sequences whose last new token yields a frame this step."""
    return [row for row, item in enumerate(scheduled) if item.will_sample]
