"""Streaming decode of many requests at once: states in fixed slots, padded batches, one CUDA graph per shape.

    slots = SlotDecoder(decoder, max_streams=68, max_rows=32)
    slots.warm_up()                                   # every (rows bucket, frames) step, graphed on CUDA
    a, b = slots.acquire(), slots.acquire()           # one slot per request, for the life of its stream
    audio = slots.decode_chunks([a, b], [codes_a, codes_b], to_host=True)
    slots.release(a)

A call groups its chunks into forward passes (one chunk per stream per pass; chunks of different lengths share a
pass where that is cheaper, `pass_plan`), pads each pass up to a row bucket with rows that read the pool's untouched
scratch slot and each chunk at its end up to the pass's frame bucket, and runs the step of that (rows, frames) shape.
Chunks longer than `max_chunk_frames` are decoded in pieces (streaming is exact, so pieces concatenate to the whole).
A row's result never depends on the other rows of its batch, and a stream's chunks concatenate to its full decode (up
to float rounding).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from services.model.codec.decoder import CodecDecoder
from services.model.codec.errors import CodecInputError
from services.model.codec import pass_plan
from services.model.codec.pass_plan import bucket_of, frame_buckets, plan_round, rounds, shape_buckets
from services.model.codec.shape_step import ShapeStep
from services.model.codec.slot_pool import CodecSlotPool, SlotSnapshot

log = logging.getLogger(__name__)

DEFAULT_MAX_CHUNK_FRAMES = 8
"""The decode service's largest chunk: one step shape per length 1..8 covers every chunk it sends."""

PRIME_PASS_LENGTHS = (64, 32, 16, 8, 4, 2, 1)
"""The lengths of a priming pass, each one step shape of its own (on CUDA a graph, captured at the warm-up): a
reference of any length is primed in passes of these lengths, so none runs at a length new to cuDNN: in benchmark
mode (which the graphed steps need) cuDNN times its algorithms at every new length, a stall of seconds in the middle
of serving, and eager passes are bound by their launches. The largest bounds a pass's activations: 64 frames are
122,880 samples in each of the last layers' channels."""


def priming_passes(num_frames: int) -> list[int]:
    """The pass lengths that prime `num_frames` frames, longest first: as many of the longest as fit, then the
    remainder's binary digits (a 6-s reference, 75 frames: 64 + 8 + 2 + 1)."""
    longest = PRIME_PASS_LENGTHS[0]
    passes = [longest] * (num_frames // longest)
    rest = num_frames % longest
    return passes + [length for length in PRIME_PASS_LENGTHS[1:] if rest & length]


class SlotDecoder:
    """A `CodecDecoder` run over a `CodecSlotPool` in padded, fixed-shape steps (CUDA graphs when `capture`).

    Not thread-safe: every method runs on the one thread that owns the decoder.
    """

    def __init__(self, decoder: CodecDecoder, *, max_streams: int, max_rows: int = 32,
                 max_chunk_frames: int = DEFAULT_MAX_CHUNK_FRAMES, capture: bool | None = None) -> None:
        if max_chunk_frames < 1:
            raise ValueError(f"max_chunk_frames must be >= 1, got {max_chunk_frames}")
        self.decoder = decoder
        self.frame_buckets = frame_buckets(max_chunk_frames)
        self.rows_by_frames = shape_buckets(max_rows, max_chunk_frames)
        """Each frame bucket's row buckets: the (rows, frames) step shapes."""
        self.max_chunk_frames = max_chunk_frames
        self.capture = decoder.device.type == "cuda" if capture is None else capture
        if self.capture and decoder.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA decoder, this one is on {decoder.device}")
        with torch.inference_mode():
            self.pool = CodecSlotPool(decoder.stream_layout, max_streams, decoder.device, decoder.dtype)
        self._graph_pool = torch.cuda.graph_pool_handle() if self.capture else None
        if self.capture:
            # cuDNN picks each convolution's algorithm by timing them at the warm-up before capture, not by its
            # heuristic, which can give a 384-channel k=7 conv of a long row a generic kernel that does not use the
            # tensor cores (a large share of a graphed call). Process-wide, as torch's flag is; the decoder's other
            # users gain from it too.
            torch.backends.cudnn.benchmark = True
        self._steps: dict[tuple[int, int], ShapeStep] = {}
        self._priming_pool: CodecSlotPool | None = None
        self._priming_stream: torch.cuda.Stream | None = None
        self._priming_steps: dict[int, ShapeStep] = {}
        # The priming passes replay beside the batched steps (another thread and stream): their graphs must not
        # share the batched steps' memory pool.
        self._priming_graph_pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.num_passes = 0
        """Batched passes run (a call runs one or more; priming passes not counted)."""
        self.num_row_frames = 0
        """Frames those passes decoded for streams."""
        self.num_padded_row_frames = 0
        """Rows x frames those passes ran, padding included: against `num_row_frames`, what the padding cost."""
        self.capture_failures: dict[tuple[int, int], str] = {}
        """(rows, frames) -> why its capture failed; those shapes run eagerly."""
        self.priming_capture_failures: dict[tuple[int, int], str] = {}
        """The same for the priming passes (one row each)."""

    @property
    def max_rows(self) -> int:
        return pass_plan.max_rows(self.rows_by_frames)

    @property
    def max_streams(self) -> int:
        return self.pool.max_streams

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(rows, frames) of every step built so far, in order."""
        return sorted(self._steps)

    @property
    def num_graphs(self) -> int:
        return sum(step.is_graphed for step in self._steps.values())

    @torch.inference_mode()
    def warm_up(self, priming: bool = False) -> None:
        """Build (and on CUDA capture) the step of every shape now, so the first requests run as fast as the rest;
        with `priming`, also every priming pass (`PRIME_PASS_LENGTHS`), for in-context clones' references."""
        for frames, buckets in self.rows_by_frames.items():
            for rows in buckets:
                self._step(rows, frames)
        if priming:
            for frames in PRIME_PASS_LENGTHS:
                self._priming_step(frames, capture=self.capture)
        if self.capture:
            torch.cuda.synchronize(self.decoder.device)
            graphed = sum(step.is_graphed for step in self._priming_steps.values())
            log.info("codec: %d of %d step shapes and %d of %d priming passes captured as CUDA graphs",
                     self.num_graphs, len(self._steps), graphed, len(self._priming_steps))

    def acquire(self) -> int:
        """A slot holding a fresh stream's state (SlotsExhausted when every slot is taken)."""
        with torch.inference_mode():
            return self.pool.acquire()

    def release(self, slot: int) -> None:
        self.pool.release(slot)

    @torch.inference_mode()
    def decode_chunks(self, slots: Sequence[int], codes: Sequence[torch.Tensor], *, to_host: bool = False,
                      on_ready: Callable[[list[int], list[torch.Tensor]], None] | None = None,
                      urgent: Sequence[bool] = ()) -> list[torch.Tensor]:
        """Decode one chunk (`codes[i]`: [n, 16] integers, best on the host) for the stream in `slots[i]` each.

        A slot listed more than once gets its chunks in list order. Every chunk is validated before any state
        changes. Returns float32 samples [n * samples_per_frame] per entry, in input order: on the decoder's device,
        or with `to_host` on the CPU (one synchronisation a pass that completes an entry, when `on_ready` is given,
        else one for the whole call). `on_ready(entries, samples)`, when given, is called on this thread as soon as
        a pass completes entries (shorter chunks' passes come first), so their audio need not wait for the call's
        longer passes. Entries marked in `urgent` go in passes of their own before the others of their round
        (`pass_plan.plan_round`).
        """
        pieces, owners = self._pieces(slots, codes)
        outputs: list[torch.Tensor | None] = [None] * len(pieces)
        pieces_of: list[list[int]] = [[] for _ in slots]
        for piece, owner in enumerate(owners):
            pieces_of[owner].append(piece)
        pieces_left = [len(of) for of in pieces_of]
        lengths = [piece.shape[0] for piece in pieces]
        for round_rows in rounds([slots[owner] for owner in owners], lengths):
            hurried = [bool(urgent) and urgent[owners[r]] for r in round_rows]
            for members in plan_round([lengths[r] for r in round_rows], self.rows_by_frames, self.frame_buckets,
                                      hurried):
                group = [round_rows[member] for member in members]
                audio = self._run_pass([slots[owners[r]] for r in group], [pieces[r] for r in group], to_host)
                for row, samples in zip(group, audio):
                    outputs[row] = samples
                    pieces_left[owners[row]] -= 1
                if on_ready is not None:
                    done = sorted({owners[r] for r in group if pieces_left[owners[r]] == 0})
                    if done:
                        self._synchronize(to_host)
                        on_ready(done, [self._joined([outputs[p] for p in pieces_of[e]], to_host) for e in done])
        self._synchronize(to_host)
        return [self._joined([outputs[p] for p in pieces_of[entry]], to_host) for entry in range(len(slots))]

    @torch.inference_mode()
    def primed_state(self, context: torch.Tensor) -> SlotSnapshot:
        """The state a fresh stream has once `context` ([m, 16] codes: an in-context clone's reference frames) is
        decoded into it, unvoiced; `restore` puts it in a stream's slot.

        It runs in a pool of its own, one slot, so it may run on another thread than the decoding (on CUDA, on a
        stream of its own, finished before it returns) without touching a request's slot: a voice is primed beside
        the batched calls, not inside them. The passes have the lengths `priming_passes` gives (graphs replayed,
        where the warm-up captured them); streaming is exact, so the state is the one any chunking of the same frames
        leaves (up to float rounding). Not thread-safe with itself: one priming thread.
        """
        self.decoder.validate_codes(context)
        device = self.decoder.device
        side = contextlib.nullcontext()
        if device.type == "cuda":
            self._priming_stream = self._priming_stream or torch.cuda.Stream(device)
            side = torch.cuda.stream(self._priming_stream)
        with side:
            pool = self._priming_pool_()
            slot = pool.acquire()
            try:
                host_slot, start = torch.tensor([slot], dtype=torch.long), 0
                for frames in priming_passes(context.shape[0]):
                    piece = context[start:start + frames].to("cpu", torch.long)
                    # A length the warm-up did not prepare runs eagerly: capturing here, beside the codec thread's
                    # replays, is not safe.
                    self._priming_step(frames, capture=False).run(host_slot, piece[None], torch.tensor([frames]))
                    start += frames
                state = pool.snapshot(slot)
            finally:
                pool.release(slot)
            if device.type == "cuda":
                self._priming_stream.synchronize()  # ready before another stream reads it
        return state

    def _priming_pool_(self) -> CodecSlotPool:
        if self._priming_pool is None:
            self._priming_pool = CodecSlotPool(self.decoder.stream_layout, 1, self.decoder.device, self.decoder.dtype)
        return self._priming_pool

    def _priming_step(self, frames: int, capture: bool) -> ShapeStep:
        step = self._priming_steps.get(frames)
        if step is None:
            step = ShapeStep(self.decoder, self._priming_pool_(), 1, frames)
            if capture:
                self._try_capture(step, self._priming_graph_pool, self.priming_capture_failures)
            self._priming_steps[frames] = step
        return step

    @torch.inference_mode()
    def restore(self, slot: int, snapshot: SlotSnapshot) -> None:
        """Put a primed state in the stream's slot (on the decoding thread, in order with its chunks)."""
        self.pool.restore(slot, snapshot)

    def _pieces(self, slots: Sequence[int], codes: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
        """Validated chunks cut to at most `max_chunk_frames` frames, and the input entry each piece belongs to."""
        if len(slots) != len(codes):
            raise CodecInputError("length_mismatch", f"{len(slots)} slots but {len(codes)} code chunks")
        for slot in slots:
            self.pool.check_in_use(slot)
        for chunk in codes:
            self.decoder.validate_codes(chunk)
        pieces, owners = [], []
        for entry, chunk in enumerate(codes):
            for start in range(0, chunk.shape[0], self.max_chunk_frames):
                pieces.append(chunk[start:start + self.max_chunk_frames].to("cpu", torch.long))
                owners.append(entry)
        return pieces, owners

    def _run_pass(self, slots: list[int], chunks: list[torch.Tensor], to_host: bool) -> list[torch.Tensor]:
        """One padded step over chunks of at most a frame bucket's length, one per slot; returns each chunk's
        samples (copied out)."""
        real, lengths = len(slots), [chunk.shape[0] for chunk in chunks]
        longest = max(lengths)
        frames = bucket_of(self.frame_buckets, longest)
        rows = bucket_of(self.rows_by_frames[frames], real)
        pinned = self.decoder.device.type == "cuda"
        host_slots = torch.full((rows,), self.pool.scratch, dtype=torch.long, pin_memory=pinned)
        host_slots[:real] = torch.tensor(slots, dtype=torch.long)
        host_lengths = torch.full((rows,), frames, dtype=torch.long, pin_memory=pinned)
        host_lengths[:real] = torch.tensor(lengths, dtype=torch.long)
        host_codes = torch.zeros((rows, frames, self.decoder.config.num_quantizers), dtype=torch.long,
                                 pin_memory=pinned)
        host_codes[:real, :longest] = pad_sequence(chunks, batch_first=True)
        audio = self._step(rows, frames).run(host_slots, host_codes, host_lengths)[:real]
        self.num_passes += 1
        self.num_row_frames += sum(lengths)
        self.num_padded_row_frames += rows * frames
        if to_host:
            copied = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=pinned)
            copied.copy_(audio, non_blocking=True)
        else:
            copied = audio.clone()
        per_frame = self.decoder.samples_per_frame
        return [samples[:length * per_frame] for samples, length in zip(copied, lengths)]

    def _step(self, rows: int, frames: int) -> ShapeStep:
        step = self._steps.get((rows, frames))
        if step is None:
            step = ShapeStep(self.decoder, self.pool, rows, frames)
            if self.capture:
                self._try_capture(step, self._graph_pool, self.capture_failures)
            self._steps[(rows, frames)] = step
        return step

    def _try_capture(self, step: ShapeStep, graph_pool, failures: dict) -> None:
        try:
            step.capture(graph_pool)
        except Exception as exc:  # any capture failure leaves that shape eager; reported once, here
            reason = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            failures[(step.rows, step.frames)] = reason
            log.warning("codec: capturing the %d x %d-frame step failed, it runs eagerly: %s", step.rows,
                        step.frames, reason)

    def _synchronize(self, to_host: bool) -> None:
        """Wait for the copies to the host so far (with `to_host` on CUDA: the host tensors are then filled)."""
        if to_host and self.decoder.device.type == "cuda":
            torch.cuda.current_stream(self.decoder.device).synchronize()

    def _joined(self, parts: list[torch.Tensor], to_host: bool) -> torch.Tensor:
        """One input entry's samples from its pieces' (an empty chunk gives no samples)."""
        if not parts:
            return torch.zeros(0, device="cpu" if to_host else self.decoder.device)
        return torch.cat(parts) if len(parts) > 1 else parts[0]
