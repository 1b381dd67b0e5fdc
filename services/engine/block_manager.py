"""Ownership of the paged KV pool's blocks: reference counts and a free list.

The block manager knows nothing about tensors: a block id indexes the first dimension of the
block-major pool (services/model/attention_batch.py). A request's blocks are its block table,
a list of ids in token order; token `t` of the request lives in slot
`table[t // block_size] * block_size + t % block_size`.
"""

from __future__ import annotations

from collections import deque

from services.engine.errors import BlockPoolError, ConfigError


class BlockManager:
    """Hands out KV blocks, counts who holds each, and takes them back when the count reaches zero."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ConfigError(f"BlockManager needs positive num_blocks and block_size, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks (each with one reference)."""
        if not self.can_allocate(num_blocks):
            raise BlockPoolError(f"asked for {num_blocks} blocks with only {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        for block in blocks:
            self._ref_counts[block] = 1
        return blocks

    def can_append(self, block_table: list[int], num_tokens: int) -> bool:
        """Whether `block_table` can grow to hold `num_tokens` tokens."""
        return self.can_allocate(max(0, self.num_blocks_for(num_tokens) - len(block_table)))

    def append(self, block_table: list[int], num_tokens: int) -> bool:
        """Grow `block_table` in place to hold `num_tokens` tokens; all or nothing (False: nothing changed)."""
        missing = self.num_blocks_for(num_tokens) - len(block_table)
        if missing <= 0:
            return True
        if not self.can_allocate(missing):
            return False
        block_table.extend(self.allocate(missing))
        return True

    def share(self, block_table: list[int]) -> list[int]:
        """Another holder of the same blocks (e.g. a shared prompt prefix): one more reference each."""
        for block in block_table:
            if self._ref_counts[block] == 0:
                raise BlockPoolError(f"cannot share block {block}: it is free")
            self._ref_counts[block] += 1
        return list(block_table)

    def free(self, block_table: list[int]) -> None:
        """Drop one reference to each block of the table and empty it; unreferenced blocks go back to the pool."""
        for block in block_table:
            if self._ref_counts[block] == 0:
                raise BlockPoolError(f"block {block} freed twice")
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self._free.append(block)
        block_table.clear()
