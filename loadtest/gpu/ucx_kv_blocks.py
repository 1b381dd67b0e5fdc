"""The KV blocks a hand-off moves: block-major pool blocks (`attention_batch.kv_pool_shape`) of one prompt.

Both peers derive everything from a `HandoffSpec` and a trial seed: which pool blocks the sender's sequence
occupies, which blocks the receiver gives it, and the blocks' contents, so the receiver checks what arrived
bit for bit without the data ever travelling twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from services.model.attention_batch import kv_pool_shape

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HandoffSpecError(ValueError):
    """An impossible hand-off setting; `code` is machine-readable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class HandoffSpec:
    """Model shape of the KV pool (defaults: the 0.6B talker) and the pool size on each side."""

    num_layers: int = 28
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: str = "bfloat16"
    pool_blocks: int = 160
    device: str = "cuda"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size", "pool_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise HandoffSpecError(f"{name} must be a positive integer, got {value!r}", "invalid_spec")
        if self.dtype not in DTYPES:
            raise HandoffSpecError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}", "invalid_dtype")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, ...]:
        return kv_pool_shape(1, self.num_layers, self.block_size, self.num_kv_heads, self.head_dim)[1:]

    @property
    def block_bytes(self) -> int:
        count = 1
        for size in self.block_shape:
            count *= size
        return count * torch.empty((), dtype=self.torch_dtype).element_size()

    def blocks_for(self, tokens: int) -> int:
        """Blocks a prompt of `tokens` tokens fills; refused when either pool cannot hold it."""
        blocks = -(-tokens // self.block_size)
        if tokens <= 0 or blocks > self.pool_blocks:
            raise HandoffSpecError(f"{tokens} tokens need {blocks} blocks; the pool holds {self.pool_blocks}",
                                   "prompt_too_long")
        return blocks

    def to_dict(self) -> dict:
        return asdict(self)


def new_pool(spec: HandoffSpec) -> torch.Tensor:
    shape = kv_pool_shape(spec.pool_blocks, spec.num_layers, spec.block_size, spec.num_kv_heads, spec.head_dim)
    return torch.empty(shape, dtype=spec.torch_dtype, device=spec.device)


def block_ids(spec: HandoffSpec, tokens: int, seed: int, side: str) -> torch.Tensor:
    """The pool blocks the sequence occupies on `side` ("sender" or "receiver"): scattered, as an engine leaves
    them, and different on the two sides (the receiver maps the sequence into its own free blocks)."""
    salt = {"sender": 1, "receiver": 2}[side]
    generator = torch.Generator().manual_seed(seed * 7919 + salt)
    return torch.randperm(spec.pool_blocks, generator=generator)[: spec.blocks_for(tokens)].to(spec.device)


def block_contents(spec: HandoffSpec, tokens: int, seed: int) -> torch.Tensor:
    """[blocks, *block_shape] random values of the sequence (random, never zeros: zeros hide unwritten data)."""
    generator = torch.Generator(device=spec.device).manual_seed(seed)
    shape = (spec.blocks_for(tokens), *spec.block_shape)
    return torch.randn(shape, generator=generator, device=spec.device, dtype=torch.float32).to(spec.torch_dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe), for checking received blocks."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view: sends read from it, receives write into it)."""
    if not tensor.is_contiguous():
        raise HandoffSpecError("a transfer buffer must be contiguous", "not_contiguous")
    return tensor.reshape(-1).view(torch.uint8)
