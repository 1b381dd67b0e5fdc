"""The model runner: one scheduled step -> input rows + AttentionBatch -> talker -> sampled frames.

It owns the paged KV pool tensor and the repetition-penalty rows (`SeenTable`). Input rows come from three
sources: a prompt's prefill rows, a replay's rows (prompt + every stored frame, for a request preempted
earlier), or, for a decoding request, the input of its last frame (all 16 codes plus its trailing text row).

With graphs enabled, the whole talker step, decoding rows and prefill chunks together, replays the CUDA graph
of its token bucket (`PaddedTalkerStep`), and the frames are sampled by `PaddedFrameSampler`, graphed per rows
bucket, reading each request's sampling parameters and penalty row on the device by its slot (`SlotParams`,
`SeenTable`): a step uploads one [B, 2] table of (slot, frame index) for its rows. Otherwise both run eagerly.
No value is read back from the device before the step's codes, which are its one host synchronisation, and
`launch` returns before that: the codes are copied to the host asynchronously and read by `InFlightStep.result`,
so the next step can be prepared while this one runs. A decoding row's input is built on the device from the codes
its request drew last (`SeenTable.last_frames`), so it does not wait for them to reach the host either.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from services.engine import model_ops
from services.engine.errors import RemoteStageFailed
from services.engine.batch_builder import build_attention_batch, on_device, sampling_rows
from services.engine.in_flight_step import InFlightStep
from services.engine.outputs import ModelRunnerOutput, ScheduledSequence
from services.engine.predictor_graphs import PaddedFrameSampler, params_mode
from services.engine.seen_table import SeenTable
from services.engine.slot_params import SlotParams
from services.engine.sequence import NUM_CODEBOOKS, Sequence
from services.engine.talker_graphs import PaddedTalkerStep, TalkerGraphSpec
from services.model.attention_batch import AttentionBatch
from services.model.loader import TTSModel
from services.model.sampling import RowSampling, SamplingParams
from services.model.uploads import upload


SLOT, FRAME, TOKEN = 0, 1, 2
"""Columns of a step's row index table: each sampling row's `SeenTable` slot, frame index, and last token."""

ROW_COUNT_CLASSES = (1, 2, 16)
"""One row count of each class Triton compiles an integer argument for: 1, a multiple of 16, any other."""


class RemotePredictorLike(Protocol):
    """Codebooks 1..15 from elsewhere (services.mtp.client.RemotePredictor): blocking, called on the engine thread."""

    def predict_rest(self, hidden: torch.Tensor, c0: torch.Tensor, seeds: list[int], frames: list[int],
                     params: list[SamplingParams]) -> torch.Tensor: ...


class ModelRunner:
    """Runs the talker and the code predictor over a scheduled batch."""

    def __init__(
        self,
        model: TTSModel,
        num_blocks: int,
        block_size: int,
        capture_hidden: bool = False,
        replay: model_ops.ReplayBuilder = model_ops.replay_rows,
        graphs: TalkerGraphSpec | None = None,
        max_num_seqs: int | None = None,
        remote_predictor: RemotePredictorLike | None = None,
    ) -> None:
        """`graphs`: pad and graph the talker step and frame sampling (None: every step eager).
        `max_num_seqs`: rows of the repetition-penalty table (default: the graphs' largest step, else 64).
        `remote_predictor`: where codebooks 1..15 come from when not from this process (remote code-predictor
        replicas, the `mtp` topology): the talker and codebook 0 stay here, frame sampling runs eagerly (a graph
        cannot hold the round trip), and each step waits for the replicas' reply."""
        self.model = model
        self.block_size = block_size
        self.capture_hidden = capture_hidden
        self.replay = replay
        """Builds a preempted request's replay rows; replaceable so tests can prove a wrong replay is caught."""
        # Padding rows of a graphed step need a block no request owns: block `num_blocks`, past the manager's.
        scratch_blocks = 0 if graphs is None else 1
        shape = model_ops.kv_pool_shape(model, num_blocks + scratch_blocks, block_size)
        self.kv_pool = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.eos_id = model_ops.eos_id(model)
        self.talker_step = (None if graphs is None
                            else PaddedTalkerStep(model.talker, self.kv_pool, num_blocks, graphs))
        self.remote_predictor = remote_predictor
        self.frame_sampler = (None if graphs is None or remote_predictor is not None
                              else PaddedFrameSampler(model, graphs.max_num_seqs, graphs.capture))
        rows = max_num_seqs or (graphs.max_num_seqs if graphs is not None else 64)
        self.seen = SeenTable(rows, model.config.talker.vocab_size, model.device)
        self.slot_params = SlotParams(rows, model.device)
        """The sampling parameters of each penalty row's request, read on the device by the graphed sampler."""

    def prepare_graphs(self) -> None:
        """Capture every graph a step can need now (start-up), so that the first requests run as fast as the rest."""
        if self.talker_step is not None:
            self.talker_step.prepare_all()
        if self.frame_sampler is not None:
            self.frame_sampler.prepare_all()
            self._compile_slot_sampling()

    def _compile_slot_sampling(self) -> None:
        """Run the graphed sampling's eager part (`PaddedFrameSampler.run_from_slots`) once for each class of row
        count its Triton kernel (`fused_row_keys`) is compiled for: one row, a multiple of 16 and any other count.
        Triton compiles a kernel at its first launch with each: on a machine whose Triton cache is empty, the first
        step with one row, the first with a few and the first with 16k would each wait for a compile, on the host,
        with every stream in the step."""
        talker, device = self.model.config.talker, self.model.device
        defaults = SamplingParams()
        modes = (params_mode([defaults], talker.vocab_size, self.model.kernels),
                 params_mode([defaults], talker.code_predictor.vocab_size, self.model.kernels))
        for count in ROW_COUNT_CLASSES:
            if self.frame_sampler.bucket(count) is None:
                continue
            hidden = torch.zeros((count, self.model.talker.hidden_size), dtype=self.model.dtype, device=device)
            # Laid out as `launch` uploads it (slot, frame, token columns); slot 0 and frame 0 are only read.
            index = torch.zeros((count, 3), dtype=torch.int64, device=device)
            self.frame_sampler.run_from_slots(hidden, index[:, SLOT : FRAME + 1], self.seen.table, self.slot_params,
                                              modes)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    @property
    def num_capture_failures(self) -> int:
        """Graphs that could not be captured and run eagerly instead."""
        return sum(part.num_capture_failures for part in (self.talker_step, self.frame_sampler) if part is not None)

    def forget(self, request_id: str) -> None:
        """The request left the running set (ended or preempted): free its penalty row."""
        slot = self.seen.release(request_id)
        if slot is not None:
            self.slot_params.vacate(slot)

    def forget_all(self) -> None:
        """Every request left the running set (a drain)."""
        for slot in self.seen.clear():
            self.slot_params.vacate(slot)

    def execute(self, scheduled: list[ScheduledSequence]) -> ModelRunnerOutput:
        """Compute every scheduled token's K/V and sample a frame for each sequence whose tokens are complete."""
        return self.launch(scheduled).result()

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledSequence]) -> InFlightStep:
        """`execute` without waiting: the step is queued on the device; its output is `result()` of the return."""
        device = self.model.device
        begun = InFlightStep.begin_on_device(device)  # the step's device time starts here (StepTimeline)
        batch = build_attention_batch(scheduled, self.block_size)  # on the host: no reads back from the device
        query_start = batch.query_start.tolist()
        rows = sampling_rows(scheduled)
        seqs = [scheduled[row].seq for row in rows]
        slots = self.seen.slots_of(seqs)  # before the inputs: a decoding row's input reads its last frame's row
        # Each sampled row's slot, frame index and last token in the step: the one upload of a step's row indices,
        # read by the decode rows' inputs, the last hidden states' gather and the sampler.
        index = np.empty((len(seqs), 3), dtype=np.int64)
        index[:, SLOT], index[:, FRAME] = slots, [seq.num_sampled_frames for seq in seqs]
        index[:, TOKEN] = [query_start[row + 1] - 1 for row in rows]
        index = upload(torch.from_numpy(index), device)
        self._write_handed_kv(scheduled)
        # Where the graphed talker reads its rows: the inputs are built there, not copied in after.
        staging = None if self.talker_step is None else self.talker_step.input_rows(batch)
        hidden = self._talker(self._input_rows(scheduled, query_start, seqs, index, staging), batch)
        if not rows:
            return InFlightStep.empty()
        if rows[-1] == len(rows) - 1 and query_start[-1] == len(rows):  # one token a row: the rows are the tokens
            last_hidden = hidden[: len(rows)]
        else:
            last_hidden = hidden.index_select(0, index[:, TOKEN])
        codes = self._sample(last_hidden, seqs, slots, index[:, SLOT : FRAME + 1])
        return InFlightStep.start([seq.request_id for seq in seqs], codes, self.eos_id,
                                  last_hidden if self.capture_hidden else None, begun)

    def _write_handed_kv(self, scheduled: list[ScheduledSequence]) -> None:
        """Requests first scheduled with KV computed elsewhere (a remote prefill): their blocks get it now, on the
        step's stream, before the talker reads them; the request computes only its last frame's input here."""
        for item in scheduled:
            handed = item.seq.handed_kv
            if handed is None:
                continue
            blocks = torch.tensor(item.seq.block_table[: handed.shape[0]], dtype=torch.int64)
            self.kv_pool.index_copy_(0, upload(blocks, self.kv_pool.device), handed.to(self.kv_pool.device))
            item.seq.handed_kv = None

    def export_blocks(self, blocks: tuple[int, ...]) -> torch.Tensor:
        """A copy of these pool blocks [n, *block] (a prompt's KV for a decode replica), queued on the step stream
        so it reads them after the step that wrote them and before any later step reuses them."""
        index = torch.tensor(blocks, dtype=torch.int64)
        return self.kv_pool.index_select(0, upload(index, self.kv_pool.device))

    def _talker(self, embeds: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """The talker's hidden states [T, H]: the graph of the step's token bucket when one fits, else eager."""
        if self.talker_step is not None and self.talker_step.bucket(batch) is not None:
            return self.talker_step.run(embeds, batch)
        return self.model.talker(embeds, on_device(batch, self.model.device), self.kv_pool)

    def _input_rows(self, scheduled: list[ScheduledSequence], query_start: list[int], seqs: list[Sequence],
                    index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The flattened input rows [T, H]: decode rows built in one batch from each request's last frame on the
        device, prefill slices copied in place (`seqs`: the sequences that sample a frame this step, every decoding
        one among them; `index`: their row indices on the device, as `launch` uploads them). Written into `out`
        ([T, H], the graphed talker's input buffer) when given; fewer torch calls on the engine thread, each of
        which hands the interpreter lock to decode's other threads and must win it back."""
        model = self.model
        is_decode = [_is_decode(item) for item in scheduled]
        if all(is_decode):  # decode rows only, each sampling, in order: the built rows are the step's rows
            return self._decode_rows(seqs, index[:, SLOT], out)
        rows = out if out is not None else torch.empty((query_start[-1], model.talker.hidden_size),
                                                       dtype=model.dtype, device=model.device)
        if any(is_decode):
            # Built for every sampling row and put at its last token: a row that ends a prefill chunk gets an
            # unused one there, overwritten by its chunk below (no per-step list of the decode rows to upload).
            rows.index_copy_(0, index[:, TOKEN], self._decode_rows(seqs, index[:, SLOT]))
        for position, item in enumerate(scheduled):
            if not is_decode[position]:
                source = self._prefill_source(item.seq)
                rows[query_start[position] : query_start[position + 1]] = \
                    source[item.start : item.start + item.num_new_tokens]
        return rows

    def _decode_rows(self, seqs: list[Sequence], slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The input rows [len(seqs), H] after each sequence's last frame, built on the device from its `SeenTable`
        row (`slots`, on the device); written into `out` when given."""
        model = self.model
        codes = self.seen.last_frames.index_select(0, slots)
        built = model_ops.frame_input_rows(model, [s.prompt for s in seqs], codes, [s.text_position for s in seqs],
                                           out)
        return built if out is not None else built.to(model.dtype)

    def _prefill_source(self, seq: Sequence) -> torch.Tensor:
        """The rows a prefill reads, built once per prefill (a chunked one reuses them)."""
        if seq.prefill_embeds is None:
            if seq.num_frames == 0:
                seq.prefill_embeds = model_ops.prompt_rows(seq.prompt)
            else:
                seq.prefill_embeds = self.replay(self.model, seq.prompt, seq.frames)
        return seq.prefill_embeds

    def _sample(self, hidden: torch.Tensor, seqs: list[Sequence], slots: list[int],
                index: torch.Tensor) -> torch.Tensor:
        """A frame of each row; `slots` its `SeenTable` rows, `index` [B, 2] their (slot, frame index) on the device."""
        device, slot_index = self.model.device, index[:, SLOT]
        sampler = self.frame_sampler
        if self.remote_predictor is None and sampler is not None and sampler.bucket(len(seqs)) is not None:
            # Every per-row value is on the device already (the slot's parameters, its penalty row): few launches.
            self.slot_params.hold(slots, seqs)
            talker = self.model.config.talker
            modes = (params_mode([s.params for s in seqs], talker.vocab_size, self.model.kernels),
                     params_mode([s.predictor_params for s in seqs], talker.code_predictor.vocab_size,
                                 self.model.kernels))
            codes = sampler.run_from_slots(hidden, index, self.seen.table, self.slot_params, modes)
            self.seen.mark(slot_index, codes)
            return codes
        seeds, frames = [s.seed for s in seqs], [s.num_sampled_frames for s in seqs]
        talker_rows = RowSampling.build([s.params for s in seqs], seeds, frames, device)
        seen = self.seen.rows(slot_index)
        host = upload(torch.tensor([[s.params.repetition_penalty for s in seqs], frames,
                                    [s.min_new_frames for s in seqs]], dtype=torch.float64), device)
        penalty, counts, min_frames = host[0].float(), host[1].long(), host[2].long()
        if self.remote_predictor is not None:
            first = model_ops.sample_codebook0(self.model, hidden, seen, counts, penalty, talker_rows, min_frames)
            codes = torch.cat((first[:, None], self._remote_rest(hidden, first, seqs, seeds, frames)), dim=1)
        else:
            predictor_rows = RowSampling.build([s.predictor_params for s in seqs], seeds, frames, device,
                                               keys=talker_rows.keys)
            codes = model_ops.sample_frames(self.model, hidden, seen, counts, penalty, talker_rows,
                                            predictor_rows, min_frames)
        self.seen.mark(slot_index, codes)
        return codes

    def _remote_rest(self, hidden: torch.Tensor, first: torch.Tensor, seqs: list[Sequence], seeds: list[int],
                     frames: list[int]) -> torch.Tensor:
        """Codebooks 1..15 from the remote predictor (it rebuilds the keyed sampler from seeds and frames)."""
        try:
            rest = self.remote_predictor.predict_rest(hidden, first, seeds, frames, [s.predictor_params for s in seqs])
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the step cannot go on
            raise RemoteStageFailed(f"the code-predictor replicas gave no codes for this step ({exc})") from exc
        return rest.to(first.device)


def _is_decode(item: ScheduledSequence) -> bool:
    """One token that is the input of the last emitted frame, with no prefill rows pending."""
    seq = item.seq
    return (seq.prefill_embeds is None and item.num_new_tokens == 1 and seq.num_sampled_frames > 0
            and item.start == seq.num_tokens - 1)
