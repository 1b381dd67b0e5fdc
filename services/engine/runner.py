"""The model runner: one scheduled step -> input rows + AttentionBatch -> talker -> sampled frames.

It owns the paged KV pool tensor. Input rows come from three sources: a prompt's prefill rows, a
replay's rows (prompt + every stored frame, for a request preempted earlier), or, for a decoding
request, the input of its last frame (all 16 codes plus its trailing text row). A decode-only step
runs through `PaddedDecodeStep` (CUDA graphs) when the engine enables it, else eagerly; either way its
attention takes the sync-free decode kernel. With graphs enabled, every step's frame sampling (codebook 0 and
the code predictor's 15 codebooks) runs through `PaddedFrameSampler`, graphed per rows bucket too.
"""

from __future__ import annotations

import torch

from services.engine import model_ops
from services.engine.batch_builder import build_attention_batch, on_device, sampling_rows
from services.engine.decode_graphs import DecodeGraphSpec, PaddedDecodeStep
from services.engine.outputs import ModelRunnerOutput, ScheduledSequence
from services.engine.predictor_graphs import PaddedFrameSampler
from services.engine.sequence import NUM_CODEBOOKS, Sequence
from services.model.attention_batch import AttentionBatch
from services.model.loader import TTSModel
from services.model.sampling import RowSampling


class ModelRunner:
    """Runs the talker and the code predictor over a scheduled batch; keeps no per-request state."""

    def __init__(
        self,
        model: TTSModel,
        num_blocks: int,
        block_size: int,
        capture_hidden: bool = False,
        replay: model_ops.ReplayBuilder = model_ops.replay_rows,
        decode_graphs: DecodeGraphSpec | None = None,
    ) -> None:
        """`decode_graphs`: pad and graph decode-only steps (None: every step eager)."""
        self.model = model
        self.block_size = block_size
        self.capture_hidden = capture_hidden
        self.replay = replay
        """Builds a preempted request's replay rows; replaceable so tests can prove a wrong replay is caught."""
        # Padding rows of a graphed step need a block no request owns: block `num_blocks`, past the manager's.
        scratch_blocks = 0 if decode_graphs is None else 1
        shape = model_ops.kv_pool_shape(model, num_blocks + scratch_blocks, block_size)
        self.kv_pool = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.eos_id = model_ops.eos_id(model)
        self.decode_step = (None if decode_graphs is None
                            else PaddedDecodeStep(model.talker, self.kv_pool, num_blocks, decode_graphs))
        self.frame_sampler = (None if decode_graphs is None
                              else PaddedFrameSampler(model, decode_graphs.max_num_seqs, decode_graphs.capture))

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSequence]) -> ModelRunnerOutput:
        """Compute every scheduled token's K/V and sample a frame for each sequence whose tokens are complete."""
        device = self.model.device
        batch = build_attention_batch(scheduled, self.block_size)  # on the host: no reads back from the device
        embeds = self._input_rows(scheduled, batch.query_start.tolist())
        hidden = self._talker(embeds, batch)
        rows = sampling_rows(scheduled)
        if not rows:
            return ModelRunnerOutput([], torch.zeros((0, NUM_CODEBOOKS), dtype=torch.int64), [])
        last_token = (batch.query_start[1:][torch.tensor(rows)] - 1).to(device)
        last_hidden = hidden[last_token]
        seqs = [scheduled[row].seq for row in rows]
        codes = self._sample(last_hidden, seqs).cpu()
        return ModelRunnerOutput(
            request_ids=[seq.request_id for seq in seqs],
            codes=codes,
            is_eos=(codes[:, 0] == self.eos_id).tolist(),
            hidden=last_hidden.float().cpu() if self.capture_hidden else None,
        )

    def _talker(self, embeds: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """The talker's hidden states [T, H]: a graphed decode step when one fits, else the eager forward."""
        if self.decode_step is not None and self.decode_step.bucket(batch) is not None:
            return self.decode_step.run(embeds, batch)
        return self.model.talker(embeds, on_device(batch, self.model.device), self.kv_pool)

    def _input_rows(self, scheduled: list[ScheduledSequence], query_start: list[int]) -> torch.Tensor:
        """The flattened input rows [T, H]: prefill slices copied in place, decode rows built in one batch."""
        model = self.model
        rows = torch.empty((query_start[-1], model.talker.hidden_size), dtype=model.dtype, device=model.device)
        decode: list[int] = []
        for index, item in enumerate(scheduled):
            if _is_decode(item):
                decode.append(index)
                continue
            source = self._prefill_source(item.seq)
            rows[query_start[index] : query_start[index + 1]] = source[item.start : item.start + item.num_new_tokens]
        if decode:
            seqs = [scheduled[index].seq for index in decode]
            codes = torch.stack([seq.last_frame for seq in seqs]).to(model.device)
            built = model_ops.frame_input_rows(model, [s.prompt for s in seqs], codes, [s.text_position for s in seqs])
            rows[torch.tensor([query_start[index] for index in decode], device=model.device)] = built.to(rows.dtype)
        return rows

    def _prefill_source(self, seq: Sequence) -> torch.Tensor:
        """The rows a prefill reads, built once per prefill (a chunked one reuses them)."""
        if seq.prefill_embeds is None:
            if seq.num_frames == 0:
                seq.prefill_embeds = model_ops.prompt_rows(seq.prompt)
            else:
                seq.prefill_embeds = self.replay(self.model, seq.prompt, seq.frames)
        return seq.prefill_embeds

    def _sample(self, hidden: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        device = self.model.device
        seeds, frames = [s.seed for s in seqs], [s.num_frames for s in seqs]
        talker_rows = RowSampling.build([s.params for s in seqs], seeds, frames, device)
        predictor_rows = RowSampling.build([s.predictor_params for s in seqs], seeds, frames, device,
                                           keys=talker_rows.keys)
        vocab = self.model.config.talker.vocab_size
        seen = torch.zeros((len(seqs), vocab), dtype=torch.bool, device=device)
        counts = torch.tensor([s.num_frames for s in seqs])
        if int(counts.sum()) > 0:
            owners = torch.repeat_interleave(torch.arange(len(seqs)), counts)
            firsts = torch.cat([s.frames[:, 0] for s in seqs])
            seen[owners.to(device), firsts.to(device)] = True
        penalty = torch.tensor([s.params.repetition_penalty for s in seqs], dtype=torch.float32, device=device)
        min_frames = torch.tensor([s.min_new_frames for s in seqs], device=device)
        sampler = self.frame_sampler
        if sampler is not None and sampler.bucket(len(seqs)) is not None:
            return sampler.run(hidden, seen, counts.to(device), penalty, talker_rows, predictor_rows, min_frames)
        return model_ops.sample_frames(self.model, hidden, seen, counts.to(device), penalty, talker_rows,
                                       predictor_rows, min_frames)


def _is_decode(item: ScheduledSequence) -> bool:
    """One token that is the input of the last emitted frame, with no prefill rows pending."""
    seq = item.seq
    return (seq.prefill_embeds is None and item.num_new_tokens == 1 and seq.num_frames > 0
            and item.start == seq.num_tokens - 1)
