"""Tensors as the raw bytes UCX moves: bfloat16 has no numpy type, so every tensor travels as uint8.

A CPU tensor becomes a numpy view (the buffer protocol); a CUDA tensor stays a tensor, which UCX reads through its
`__cuda_array_interface__`. Both are views: nothing is copied.
"""

from __future__ import annotations

import torch

from messages.kv_transfer import ITEMSIZE


def dtype_name(dtype: torch.dtype) -> str:
    """The descriptor's name of a torch dtype (`torch.bfloat16` -> "bfloat16"); ValueError for one it cannot carry."""
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise ValueError(f"a KV transfer carries {sorted(ITEMSIZE)}, not {dtype}")
    return name


def byte_view(tensor: torch.Tensor) -> object:
    """`tensor`'s bytes as an object UCX sends from or receives into, sharing its memory.

    Raises ValueError for a tensor that is not contiguous (a view of its bytes would be a copy, so a receive would
    land in the copy) or is empty (UCX moves at least one byte)."""
    if not tensor.is_contiguous():
        raise ValueError("a KV transfer moves a contiguous tensor: call .contiguous() on it first")
    if tensor.numel() == 0:
        raise ValueError("a KV transfer moves at least one element")
    flat = tensor.reshape(-1).view(torch.uint8)
    return flat if flat.is_cuda else flat.numpy()
