"""Turn a step's scheduled sequences into the flattened `AttentionBatch` the talker reads."""

from __future__ import annotations

from dataclasses import replace

import torch

from services.engine.outputs import ScheduledSequence
from services.model.attention_batch import AttentionBatch


def build_attention_batch(
    scheduled: list[ScheduledSequence], block_size: int, device: torch.device | str = "cpu"
) -> AttentionBatch:
    """Positions, KV slots and block tables of every new token, in the order of `scheduled`.

    Built on the CPU (small integer tensors) and moved to `device` in one copy each. `max_seq_len` is set
    from host-side numbers, so attention never reads sequence lengths back from the device.
    """
    starts = torch.tensor([item.start for item in scheduled], dtype=torch.int64)
    counts = torch.tensor([item.num_new_tokens for item in scheduled], dtype=torch.int64)
    num_blocks = max(len(item.seq.block_table) for item in scheduled)
    tables = torch.zeros((len(scheduled), num_blocks), dtype=torch.int64)
    for row, item in enumerate(scheduled):
        tables[row, : len(item.seq.block_table)] = torch.tensor(item.seq.block_table, dtype=torch.int64)
    query_start = torch.zeros(len(scheduled) + 1, dtype=torch.int64)
    torch.cumsum(counts, dim=0, out=query_start[1:])
    row_of_token = torch.repeat_interleave(torch.arange(len(scheduled)), counts)
    positions = starts[row_of_token] + torch.arange(int(query_start[-1])) - query_start[:-1][row_of_token]
    blocks = tables[row_of_token, positions // block_size]
    slot_mapping = blocks * block_size + positions % block_size
    return AttentionBatch(
        positions=positions.to(device),
        slot_mapping=slot_mapping.to(device),
        query_start=query_start.to(device),
        seq_lens=(starts + counts).to(device),
        block_tables=tables.to(device),
        max_seq_len=max(item.start + item.num_new_tokens for item in scheduled),
    )


def on_device(batch: AttentionBatch, device: torch.device | str) -> AttentionBatch:
    """The same batch with its tensors on `device` (the host-side `max_seq_len` travels along)."""
    return replace(batch, positions=batch.positions.to(device), slot_mapping=batch.slot_mapping.to(device),
                   query_start=batch.query_start.to(device), seq_lens=batch.seq_lens.to(device),
                   block_tables=batch.block_tables.to(device))


def sampling_rows(scheduled: list[ScheduledSequence]) -> list[int]:
    """Indices into `scheduled` of the sequences whose last new token yields a frame this step."""
    return [row for row, item in enumerate(scheduled) if item.will_sample]
