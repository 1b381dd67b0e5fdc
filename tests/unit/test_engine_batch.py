"""The flattened AttentionBatch of a mixed prefill/decode step."""

from __future__ import annotations

from services.engine.batch_builder import build_attention_batch, sampling_rows
from services.engine.outputs import ScheduledSequence
from services.engine.sequence import Sequence
from services.model.sampling import SamplingParams


def _seq(request_id: str, prompt_tokens: int, blocks: list[int], computed: int = 0) -> Sequence:
    seq = Sequence(request_id, prompt_tokens, seed=1, params=SamplingParams(), max_new_frames=8)
    seq.block_table = blocks
    seq.num_computed_tokens = computed
    return seq


def test_mixed_batch_positions_slots_and_tables() -> None:
    decoding = _seq("d", 5, [7, 2], computed=5)
    decoding.append_frame(decoding.frames.new_zeros(16))  # 6 tokens: the sixth is new
    prefill = _seq("p", 3, [4])
    chunked = _seq("c", 10, [1, 5, 6])  # first chunk of 6 of its 10 prompt tokens
    scheduled = [ScheduledSequence.of(decoding, 5, 1), ScheduledSequence.of(prefill, 0, 3), ScheduledSequence.of(chunked, 0, 6)]
    batch = build_attention_batch(scheduled, block_size=4)
    assert batch.positions.tolist() == [5, 0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert batch.slot_mapping.tolist() == [2 * 4 + 1, 16, 17, 18, 4, 5, 6, 7, 20, 21]
    assert batch.query_start.tolist() == [0, 1, 4, 10]
    assert batch.seq_lens.tolist() == [6, 3, 6]
    assert batch.block_tables.tolist() == [[7, 2, 0], [4, 0, 0], [1, 5, 6]]
    assert batch.num_seqs == 3 and batch.num_tokens == 10
    assert sampling_rows(scheduled) == [0, 1]
