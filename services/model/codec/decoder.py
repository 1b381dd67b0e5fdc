"""The Qwen3-TTS-12Hz codec decoder (code2wav): 16 codes per frame -> 1920 samples at 24 kHz.

codes -> split RVQ lookup -> causal pre-conv -> sliding-window transformer -> 2 x (causal
transposed conv + ConvNeXt) -> SEANet vocoder -> clamp. Every stage is causal with a bounded
look-back, so streaming with `CodecStreamState` is exact: a stream's chunks concatenate to
the full decode (up to float rounding), and each chunk's cost is independent of the past.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch
from torch import nn

from services.model.codec.causal_conv import CausalConv1d, StreamingConv
from services.model.codec.config import CodecConfig
from services.model.codec.errors import CodecInputError
from services.model.codec.pass_plan import rounds
from services.model.codec.quantizer import SplitQuantizerDecoder
from services.model.codec.stream_state import CodecStreamState, StreamBatch, StreamLayout, StreamRows, check_states
from services.model.codec.transformer import PreTransformer
from services.model.codec.upsampler import build_upsampler, run_upsampler
from services.model.codec.vocoder import build_vocoder, run_vocoder

FULL_DECODE_CHUNK_FRAMES = 300
"""`decode()` streams long inputs through a fresh state in chunks of this many frames, which
bounds memory; up to this length it is one forward pass, as in the reference."""


class CodecDecoder(nn.Module):
    """Full and exact streaming decode. Module names mirror the checkpoint's `decoder.*` tensors."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = SplitQuantizerDecoder(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = PreTransformer(config)
        self.upsample = build_upsampler(config)
        self.decoder = build_vocoder(config)
        self.stream_layout = self._assign_history_slots()

    def _assign_history_slots(self) -> StreamLayout:
        shapes = []
        for module in self.modules():
            if isinstance(module, StreamingConv) and module.history_len > 0:
                module.history_slot = len(shapes)
                shapes.append((module.in_channels, module.history_len))
        config = self.config
        return StreamLayout(
            conv_history_shapes=tuple(shapes),
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            window=config.sliding_window - 1,
            head_dim=config.head_dim,
        )

    @property
    def sample_rate(self) -> int:
        """24000 for the released codec."""
        return self.config.sample_rate

    @property
    def samples_per_frame(self) -> int:
        """1920 for the released codec (80 ms at 24 kHz)."""
        return self.config.samples_per_frame

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    def new_stream(self) -> CodecStreamState:
        """A fresh per-request state (constant size) on this decoder's device and dtype."""
        return CodecStreamState(self.stream_layout, self.device, self.dtype)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """LongTensor[T, 16] -> float32 Tensor[T * 1920] in [-1, 1], on this decoder's device."""
        codes = self._checked_codes(codes)
        state = self.new_stream()
        chunks = [
            self._decode_group([state], codes[None, start : start + FULL_DECODE_CHUNK_FRAMES])[0]
            for start in range(0, codes.shape[0], FULL_DECODE_CHUNK_FRAMES)
        ]
        return torch.cat(chunks) if chunks else self._empty_audio()

    @torch.inference_mode()
    def decode_chunk(self, state: CodecStreamState, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next n frames of one stream: LongTensor[n, 16] -> float32 Tensor[n * 1920].

        Updates `state` in place. Chunk sizes are free; the concatenated output equals `decode`
        of all frames so far.
        """
        return self.decode_chunks([state], [codes])[0]

    @torch.inference_mode()
    def decode_chunks(self, states: list[CodecStreamState], codes: list[torch.Tensor]) -> list[torch.Tensor]:
        """Decode one chunk for each entry of `states`, batching streams whose chunks have the
        same length into one forward pass. A state listed more than once gets its chunks in list
        order. Every chunk is validated before any state changes. Returns samples in input order."""
        if len(states) != len(codes):
            raise CodecInputError("length_mismatch", f"{len(states)} states but {len(codes)} code chunks")
        check_states(states, self.stream_layout)
        checked = [self._checked_codes(c) for c in codes]
        results: list[torch.Tensor] = [self._empty_audio()] * len(states)
        for rows in forward_passes([id(s) for s in states], [chunk.shape[0] for chunk in checked]):
            audio = self._decode_group([states[r] for r in rows], torch.stack([checked[r] for r in rows]))
            for row, samples in zip(rows, audio):
                results[row] = samples
        return results

    def _decode_group(self, states: list[CodecStreamState], codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n, Q] for B streams at any positions -> float32 [B, n * samples_per_frame]."""
        stream = StreamBatch(states)
        with self.float32_convolutions():
            audio = self.forward(codes, stream)
        stream.scatter(states, codes.shape[1])
        return audio.float()

    def float32_convolutions(self) -> contextlib.AbstractContextManager:
        """On CUDA, cuDNN runs float32 convolutions in TF32 by default: ~1e-3 off, and off
        differently for different chunk lengths, which would break exact streaming. A float32
        decoder turns TF32 off for the length of its own calls."""
        if self.device.type != "cuda" or self.dtype != torch.float32:
            return contextlib.nullcontext()
        return _cudnn_tf32_disabled()

    def forward(self, codes: torch.Tensor, stream: StreamRows) -> torch.Tensor:
        """[B, n, Q] codes -> [B, n * samples_per_frame] samples, reading and updating `stream`."""
        latents = self.pre_conv(self.quantizer(codes), stream)  # [B, latent, n]
        latents = self.pre_transformer(latents.transpose(1, 2), stream).transpose(1, 2)
        return run_vocoder(self.decoder, run_upsampler(self.upsample, latents, stream), stream)

    def _empty_audio(self) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.float32, device=self.device)

    def _checked_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Validate a [n, Q] integer tensor of codes in range; return it as int64 on our device."""
        self.validate_codes(codes)
        return codes.to(device=self.device, dtype=torch.long)

    def validate_codes(self, codes: torch.Tensor) -> None:
        """Raise CodecInputError unless `codes` is a [n, Q] integer tensor of codes in range (checked where it
        lies: a host tensor costs no device sync)."""
        config = self.config
        if not isinstance(codes, torch.Tensor):
            raise CodecInputError("codes_type", f"codes must be a torch.Tensor, got {type(codes).__name__}")
        if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise CodecInputError("codes_dtype", f"codes must be an integer tensor, got {codes.dtype}")
        if codes.dim() != 2 or codes.shape[1] != config.num_quantizers:
            raise CodecInputError(
                "codes_shape",
                f"codes must have shape [frames, {config.num_quantizers}], got {list(codes.shape)}",
            )
        if codes.numel() > 0:
            low, high = int(codes.min()), int(codes.max())
            if low < 0 or high >= config.codebook_size:
                raise CodecInputError(
                    "codes_out_of_range",
                    f"codes must lie in [0, {config.codebook_size}), got values in [{low}, {high}]",
                )


_TF32_LOCK = threading.Lock()
_tf32_holders = 0
_tf32_before = True


@contextlib.contextmanager
def _cudnn_tf32_disabled():
    # The flag is process-wide and two threads may hold it off at once (the vocoder primes a voice beside its batched
    # calls): off while any holds it, then back to what it was before the first.
    global _tf32_holders, _tf32_before
    with _TF32_LOCK:
        if _tf32_holders == 0:
            _tf32_before = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = False
        _tf32_holders += 1
    try:
        yield
    finally:
        with _TF32_LOCK:
            _tf32_holders -= 1
            if _tf32_holders == 0:
                torch.backends.cudnn.allow_tf32 = _tf32_before


def forward_passes(streams: Sequence[Hashable], lengths: Sequence[int]) -> list[list[int]]:
    """Rows of a batched decode call grouped into forward passes, in the order to run them.

    `streams[row]` names the stream a row belongs to (a state's id, a slot). Each round (`pass_plan.rounds`: each
    stream's r-th chunk, so a stream listed twice advances in order) is split by chunk length (one batch here needs
    one length), shorter chunks first. Empty chunks need no pass.
    """
    passes: list[list[int]] = []
    for round_rows in rounds(streams, lengths):
        by_length: dict[int, list[int]] = defaultdict(list)
        for row in round_rows:
            by_length[lengths[row]].append(row)
        passes += [by_length[length] for length in sorted(by_length)]
    return passes
