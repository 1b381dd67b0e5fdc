"""Batched, replay-safe sampling for the talker (codebook 0) and the code predictor (codebooks 1..15).

Every random draw is a pure function of (request seed, frame index, codebook index, vocab index):
a counter-based hash, not a stateful generator. A replayed, migrated or remotely prefilled request
therefore draws exactly the numbers an undisturbed run drew, whatever batch it lands in, and the
code predictor needs no per-request generator state.

The draw is a Gumbel-max race: `argmax(logits / T + G)` with `G = -log(-log U)` samples exactly
from `softmax(logits / T)` restricted to the tokens top-k and top-p keep. All rows go through one
set of tensor ops; no Python loop runs per row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from services.kernels import fused_draw, fused_gumbel, fused_row_keys, fused_sample
from services.kernels.triton_support import compiles_for
from services.model.kernel_verdicts import KernelVerdicts
from services.model.uploads import upload

_MASK32 = 0xFFFFFFFF
_LANE_SEEDS, _FIELD_SALTS = fused_gumbel.LANE_SEEDS, fused_gumbel.FIELD_SALTS


class SamplingParamsError(ValueError):
    """Invalid sampling parameters; `code` is machine-readable."""

    code = "invalid_sampling_params"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples. Defaults are the released generation_config's."""

    temperature: float = 0.9
    """0 means greedy (argmax); otherwise logits are divided by it before sampling."""
    top_k: int = 50
    """Keep only the k most likely tokens; 0 disables the cut."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p; 1.0 disables it."""
    repetition_penalty: float = 1.05
    """Applied to the talker's codebook-0 logits of ids it already generated (1.0 disables it)."""

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise SamplingParamsError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingParamsError(f"top_k must be an integer >= 0 (0 = no cut), got {self.top_k!r}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise SamplingParamsError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SamplingParamsError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class RowSampling:
    """Per-row sampling state of a batch, as tensors of shape [B] on the logits' device.

    The three trailing fields summarise the rows on the host, so `sample` can pick its shapes
    without reading device memory (no synchronisation); `build` and `select` fill them in.
    """

    temperature: torch.Tensor
    """float32; 0 marks a greedy row."""
    top_k: torch.Tensor
    """int64; 0 disables the cut."""
    top_p: torch.Tensor
    """float32 in (0, 1]."""
    seed: torch.Tensor
    """int64: the request's seed (any 64-bit value)."""
    frame: torch.Tensor
    """int64: index of the frame being generated (0 for the first frame)."""
    max_top_k: int | None = None
    """The largest top_k of the rows, or None when a row samples from the whole vocabulary (top_k 0)."""
    uses_top_p: bool = True
    """Whether some row has top_p < 1."""
    is_all_greedy: bool = False
    """Whether every row has temperature 0."""
    keys: torch.Tensor | None = None
    """int64 [B, 2]: `row_keys(seed, frame)`, hashed once per batch rather than once per codebook."""

    @staticmethod
    def build(
        params_per_row: Sequence[SamplingParams],
        seeds: Sequence[int],
        frames: Sequence[int],
        device: torch.device | str = "cpu",
        keys: torch.Tensor | None = None,
    ) -> RowSampling:
        """Gather per-request parameters into batch tensors (one row per request).

        `keys`: the `keys` of another RowSampling built for the same seeds and frames (e.g. the
        talker's, reused for the code predictor's rows), saving the hashing.
        """
        num_rows = len(params_per_row)
        if len(seeds) != num_rows or len(frames) != num_rows:
            raise SamplingParamsError(
                f"params_per_row, seeds and frames must have equal lengths, got {num_rows}, {len(seeds)}, {len(frames)}"
            )
        if any(frame < 0 for frame in frames):
            raise SamplingParamsError(f"frame indices must be >= 0, got {list(frames)}")
        top_ks = [p.top_k for p in params_per_row]
        is_all_greedy = all(p.is_greedy for p in params_per_row)
        # Built on the host and moved in two copies: a handful of tiny kernels instead of dozens per batch.
        ints = torch.tensor([top_ks, [as_int64(s) for s in seeds], list(frames)], dtype=torch.int64)
        if not is_all_greedy and keys is None:
            ints = torch.cat((ints, row_keys(ints[1], ints[2]).T))
        ints = upload(ints, device)
        floats = upload(torch.tensor([[p.temperature for p in params_per_row], [p.top_p for p in params_per_row]],
                                     dtype=torch.float32), device)
        if not is_all_greedy and keys is None:
            keys = ints[3:5].T
        return RowSampling(
            temperature=floats[0],
            top_k=ints[0],
            top_p=floats[1],
            seed=ints[1],
            frame=ints[2],
            max_top_k=None if 0 in top_ks or not top_ks else max(top_ks),
            uses_top_p=any(p.top_p < 1.0 for p in params_per_row),
            is_all_greedy=is_all_greedy,
            keys=None if is_all_greedy else keys,
        )

    @property
    def num_rows(self) -> int:
        return int(self.seed.shape[0])

    def select(self, index: torch.Tensor) -> RowSampling:
        """The rows at `index` (a bool mask or integer indices), e.g. the rows that did not end.

        The host-side summaries are kept as they were: still true bounds for any subset.
        """
        return RowSampling(
            self.temperature[index], self.top_k[index], self.top_p[index], self.seed[index], self.frame[index],
            self.max_top_k, self.uses_top_p, self.is_all_greedy,
            None if self.keys is None else self.keys[index],
        )


def as_int64(seed: int) -> int:
    """Seeds are 64-bit; values in [2**63, 2**64) wrap to their two's-complement int64."""
    if not -(2**63) <= seed < 2**64:
        raise SamplingParamsError(f"seed must fit in 64 bits, got {seed}")
    return seed - 2**64 if seed >= 2**63 else seed


def _mul32(x, constant: int):
    """(x * constant) mod 2**32 for x in [0, 2**32), without int64 overflow (16-bit halves).

    Works on Python ints and int64 tensors alike, with the same results.
    """
    low = (x & 0xFFFF) * constant
    high = (((x >> 16) * constant) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _hash32(x):
    """A bijective 32-bit integer mixer (xorshift-multiply, 'lowbias32' constants); ints or int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, fused_gumbel.HASH_MULTIPLIERS[0])
    x = x ^ (x >> 15)
    x = _mul32(x, fused_gumbel.HASH_MULTIPLIERS[1])
    return x ^ (x >> 16)


def row_keys(seed: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """int64 [B, 2]: two independent 32-bit hash lanes of each row's (seed, frame), 64 bits of key state."""
    if seed.device.type == "cpu":  # numpy's small-array arithmetic costs a fraction of torch's per operation
        return torch.from_numpy(np.stack(_key_lanes(seed.numpy(), frame.numpy()), axis=1))
    return torch.stack(_key_lanes(seed, frame), dim=1)


def row_keys_into(seed: torch.Tensor, frame: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`row_keys(seed, frame)` written into `out` (int64 [B, 2], any strides; a new tensor when None), returned: in
    one launch where the kernels compile for the device (`kernels.fused_row_keys`), else the torch form."""
    if compiles_for(seed.device):
        return fused_row_keys.row_keys(seed, frame, out=out)
    keys = row_keys(seed, frame)
    return keys if out is None else out.copy_(keys)


def _key_lanes(seed, frame) -> list:
    """The two hash lanes of `row_keys`, over int64 tensors or int64 numpy arrays alike (the same bits)."""
    fields = (seed & _MASK32, (seed >> 32) & _MASK32, frame & _MASK32)
    lanes = []
    for lane_seed in _LANE_SEEDS:
        state = seed * 0 + lane_seed
        for field, salt in zip(fields, _FIELD_SALTS):
            state = _hash32(state ^ field ^ salt)
        lanes.append(state)
    return lanes


def _codebook_salts(codebook: int) -> tuple[int, int]:
    """Per-codebook constants XORed into the two lanes (host ints: no device work per codebook)."""
    return _hash32(codebook ^ _FIELD_SALTS[3]), _hash32(codebook ^ _FIELD_SALTS[3] ^ _LANE_SEEDS[1])


def _uniform(keys: torch.Tensor, codebook: int, index: torch.Tensor) -> torch.Tensor:
    salt_a, salt_b = _codebook_salts(codebook)
    lane_a, lane_b = keys[:, 0:1] ^ salt_a, keys[:, 1:2] ^ salt_b
    bits = _hash32(_hash32(lane_a ^ index) ^ lane_b)
    return (bits.to(torch.float64) + 0.5) / 2.0**32


def keyed_uniform_at(seed: torch.Tensor, frame: torch.Tensor, codebook: int, index: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64 [B, K], for vocab ids index [B, K] of rows keyed (seed, frame, codebook)."""
    return _uniform(row_keys(seed, frame), codebook, index)


def keyed_uniform(seed: torch.Tensor, frame: torch.Tensor, codebook: int, vocab_size: int) -> torch.Tensor:
    """`keyed_uniform_at` over the whole vocabulary: float64 [B, vocab_size]."""
    index = torch.arange(vocab_size, dtype=torch.int64, device=seed.device)
    return keyed_uniform_at(seed, frame, codebook, index.expand(seed.shape[0], vocab_size))


def _top(scaled: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's K most likely tokens of each row, most likely first: values [B, K] and vocab ids [B, K].

    K is the largest top_k of the batch (the vocabulary when a row has none): only these tokens need noise."""
    vocab_size = scaled.shape[1]
    if rows.max_top_k is None or rows.max_top_k >= vocab_size:
        return scaled.sort(dim=1, descending=True, stable=True)
    return scaled.topk(rows.max_top_k, dim=1)


def _candidates(scaled: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens a row may draw, most likely first: values [B, K] (-inf where cut) and vocab ids [B, K].

    Rows with a smaller top_k than K mask their tail; top-p then cuts each row's low-probability tail.
    """
    vocab_size = scaled.shape[1]
    values, ids = _top(scaled, rows)
    rank = torch.arange(values.shape[1], device=scaled.device)[None, :]
    top_k = torch.where(rows.top_k > 0, rows.top_k, torch.full_like(rows.top_k, vocab_size))
    drop = rank >= top_k[:, None]
    values = values.masked_fill(drop, float("-inf"))
    if rows.uses_top_p:
        # float64 so the cut does not depend on K's effect on float32 summation order.
        probs = values.double().softmax(dim=1)
        mass_before = probs.cumsum(dim=1) - probs
        # The most likely token always survives; top_p == 1 rows skip the cut so rounding never drops a tail.
        top_p = rows.top_p.double()[:, None]
        values = values.masked_fill((mass_before >= top_p) & (top_p < 1.0) & (rank > 0), float("-inf"))
    return values, ids


def sample(logits: torch.Tensor, rows: RowSampling, codebook: int,
           kernels: KernelVerdicts = KernelVerdicts()) -> torch.Tensor:
    """Draw one token per row: LongTensor [B].

    Greedy rows (temperature 0) take the argmax of the raw logits. Other rows apply temperature,
    top-k, top-p, then a Gumbel-max draw keyed by (seed, frame, codebook, vocab id): the result of
    a row does not depend on the other rows, their order or the batch size. `kernels`: the model's start-up
    verdicts (whether the whole-row sampler may draw rows without top-p).
    """
    if logits.dim() != 2 or logits.shape[0] != rows.num_rows:
        raise SamplingParamsError(f"logits must be [B, V] with B == {rows.num_rows} rows, got {tuple(logits.shape)}")
    if codebook < 0:
        raise SamplingParamsError(f"codebook must be >= 0, got {codebook}")
    if (compiles_for(logits.device) and not rows.uses_top_p and not rows.is_all_greedy
            and kernels.samples_whole_rows(logits.shape[1])):
        # Without top-p a draw needs only which tokens are the top k, not their order: one launch, no sort.
        keys = rows.keys if rows.keys is not None else row_keys(rows.seed, rows.frame)
        return fused_sample.sample(logits, rows.temperature, rows.top_k, keys, _codebook_salts(codebook))
    greedy = logits.argmax(dim=1)
    if rows.is_all_greedy:
        return greedy
    safe_temperature = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
    scaled = logits.float() / safe_temperature[:, None]
    keys = rows.keys if rows.keys is not None else row_keys(rows.seed, rows.frame)
    if compiles_for(logits.device):  # the cuts, the noise and the draw in one launch
        values, ids = _top(scaled, rows)
        return fused_draw.draw(values, ids, rows.top_k, rows.top_p, keys, _codebook_salts(codebook),
                               rows.temperature, greedy, logits.shape[1], rows.uses_top_p)
    values, ids = _candidates(scaled, rows)
    gumbel = -torch.log(-torch.log(_uniform(keys, codebook, ids)))
    choice = (values.double() + gumbel).argmax(dim=1, keepdim=True)
    drawn = ids.gather(1, choice)[:, 0]
    return torch.where(rows.temperature > 0, drawn, greedy)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Penalise ids already generated (HF convention): positive logits divided, negative multiplied.

    logits [B, V]; seen [B, V] bool; penalty [B] (1.0 leaves a row unchanged).
    """
    factor = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits > 0, logits / factor, logits * factor)
    return torch.where(seen, penalised, logits)
