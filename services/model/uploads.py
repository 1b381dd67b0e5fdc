"""Host-to-device copies that never wait for the device.

A copy from pageable host memory makes CUDA synchronise the stream first, so every small `.to("cuda")` of a
freshly built tensor stalls the host until the GPU has finished all queued work: the host can then never run
ahead of the device. Staging through pinned memory (torch's caching host allocator) keeps the copy asynchronous.
"""

from __future__ import annotations

import torch


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` (on the host) on `device`, without a synchronisation on CUDA. Keep `tensor` unmodified afterwards."""
    device = torch.device(device)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
