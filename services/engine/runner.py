"""The model runner: one scheduled step -> input rows + AttentionBatch -> talker -> sampled frames.

It owns the paged KV pool tensor and the repetition-penalty rows (`SeenTable`). Input rows come from three
sources: a prompt's prefill rows, a replay's rows (prompt + every stored frame, for a request preempted
earlier), or, for a decoding request, the input of its last frame (all 16 codes plus its trailing text row).

A step is split by kind, not by request: the decoding rows run through `PaddedDecodeStep` (a CUDA graph per
rows bucket when the engine enables graphs) and the prefilling rows, if any, through their own eager forward
beside it, so a prefill chunk never pushes the decoding rows off the graph. The frames of both are then
sampled together (`PaddedFrameSampler`, graphed per rows bucket too). The one host synchronisation of a step
is the copy of its codes back to the host.
"""

from __future__ import annotations

import torch

from services.engine import model_ops
from services.engine.batch_builder import build_attention_batch, on_device
from services.engine.decode_graphs import DecodeGraphSpec, PaddedDecodeStep
from services.engine.outputs import ModelRunnerOutput, ScheduledSequence
from services.engine.predictor_graphs import PaddedFrameSampler
from services.engine.seen_table import SeenTable
from services.engine.sequence import NUM_CODEBOOKS, Sequence
from services.model.loader import TTSModel
from services.model.sampling import RowSampling


class ModelRunner:
    """Runs the talker and the code predictor over a scheduled batch."""

    def __init__(
        self,
        model: TTSModel,
        num_blocks: int,
        block_size: int,
        capture_hidden: bool = False,
        replay: model_ops.ReplayBuilder = model_ops.replay_rows,
        decode_graphs: DecodeGraphSpec | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        """`decode_graphs`: pad and graph decode rows and frame sampling (None: every step eager).
        `max_num_seqs`: rows of the repetition-penalty table (default: the graphs' largest bucket, else 64)."""
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
        rows = max_num_seqs or (decode_graphs.max_num_seqs if decode_graphs is not None else 64)
        self.seen = SeenTable(rows, model.config.talker.vocab_size, model.device)

    def prepare_graphs(self) -> None:
        """Capture every graph a step can need now (start-up), so that the first requests run as fast as the rest."""
        if self.decode_step is not None:
            self.decode_step.prepare_all()
        if self.frame_sampler is not None:
            self.frame_sampler.prepare_all()

    @property
    def num_capture_failures(self) -> int:
        """Graphs that could not be captured and run eagerly instead."""
        return sum(part.num_capture_failures for part in (self.decode_step, self.frame_sampler) if part is not None)

    def forget(self, request_id: str) -> None:
        """The request left the running set (ended or preempted): free its penalty row."""
        self.seen.release(request_id)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSequence]) -> ModelRunnerOutput:
        """Compute every scheduled token's K/V and sample a frame for each sequence whose tokens are complete."""
        decoding = [item for item in scheduled if _is_decode(item)]
        prefilling = [item for item in scheduled if not _is_decode(item)]
        if decoding and not self._fits_graph(decoding):
            decoding, prefilling = [], scheduled  # too large for every bucket: one eager forward for all
        hidden: list[torch.Tensor] = []
        seqs: list[Sequence] = []
        if decoding:
            hidden.append(self._decode(decoding))
            seqs += [item.seq for item in decoding]
        if prefilling:
            rows, sampled = self._prefill(prefilling)
            if sampled:
                hidden.append(rows)
                seqs += sampled
        if not seqs:
            return ModelRunnerOutput([], torch.zeros((0, NUM_CODEBOOKS), dtype=torch.int64), [])
        last_hidden = hidden[0] if len(hidden) == 1 else torch.cat(hidden)
        codes = self._sample(last_hidden, seqs).cpu()
        return ModelRunnerOutput(
            request_ids=[seq.request_id for seq in seqs],
            codes=codes,
            is_eos=(codes[:, 0] == self.eos_id).tolist(),
            hidden=last_hidden.float().cpu() if self.capture_hidden else None,
        )

    def _fits_graph(self, decoding: list[ScheduledSequence]) -> bool:
        if self.decode_step is None:
            return True  # eager decode: any size
        return self.decode_step.bucket(build_attention_batch(decoding, self.block_size)) is not None

    def _decode(self, decoding: list[ScheduledSequence]) -> torch.Tensor:
        """Hidden states [B, H] of the decoding rows (one new token each)."""
        batch = build_attention_batch(decoding, self.block_size)  # on the host: no reads back from the device
        seqs = [item.seq for item in decoding]
        codes = torch.stack([seq.last_frame for seq in seqs]).to(self.model.device, non_blocking=True)
        rows = model_ops.frame_input_rows(self.model, [s.prompt for s in seqs], codes, [s.text_position for s in seqs])
        rows = rows.to(self.model.dtype)
        if self.decode_step is not None:
            return self.decode_step.run(rows, batch)
        return self.model.talker(rows, on_device(batch, self.model.device), self.kv_pool)

    def _prefill(self, prefilling: list[ScheduledSequence]) -> tuple[torch.Tensor, list[Sequence]]:
        """The prefilling rows' eager forward: last hidden states [S, H] of the sequences that sample a frame."""
        model = self.model
        batch = build_attention_batch(prefilling, self.block_size)
        query_start = batch.query_start.tolist()
        rows = torch.empty((query_start[-1], model.talker.hidden_size), dtype=model.dtype, device=model.device)
        for index, item in enumerate(prefilling):
            if _is_decode(item):  # only when a batch too large for the graphs runs eagerly whole
                seq = item.seq
                codes = seq.last_frame[None].to(model.device)
                rows[query_start[index]] = model_ops.frame_input_rows(model, [seq.prompt], codes,
                                                                      [seq.text_position])[0]
                continue
            source = self._prefill_source(item.seq)
            rows[query_start[index] : query_start[index + 1]] = source[item.start : item.start + item.num_new_tokens]
        hidden = model.talker(rows, on_device(batch, model.device), self.kv_pool)
        sampling = [index for index, item in enumerate(prefilling) if item.will_sample]
        last = torch.tensor([query_start[index + 1] - 1 for index in sampling], dtype=torch.int64)
        return hidden[last.to(model.device)], [prefilling[index].seq for index in sampling]

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
        slots = self.seen.slots_of(seqs)
        seen = self.seen.rows(slots)
        host = torch.tensor([[s.params.repetition_penalty for s in seqs], frames, [s.min_new_frames for s in seqs]],
                            dtype=torch.float64).to(device, non_blocking=True)
        penalty, counts, min_frames = host[0].float(), host[1].long(), host[2].long()
        sampler = self.frame_sampler
        if sampler is not None and sampler.bucket(len(seqs)) is not None:
            codes = sampler.run(hidden, seen, counts, penalty, talker_rows, predictor_rows, min_frames)
        else:
            codes = model_ops.sample_frames(self.model, hidden, seen, counts, penalty, talker_rows, predictor_rows,
                                            min_frames)
        self.seen.mark(slots, codes[:, 0])
        return codes


def _is_decode(item: ScheduledSequence) -> bool:
    """One token that is the input of the last emitted frame, with no prefill rows pending."""
    seq = item.seq
    return (seq.prefill_embeds is None and item.num_new_tokens == 1 and seq.num_frames > 0
            and item.start == seq.num_tokens - 1)
