"""Capture one step function as a CUDA graph and hand back its replay."""

from __future__ import annotations

import threading
from typing import Callable

import torch

_CAPTURE_LOCK = threading.Lock()
"""One capture at a time in the process. Two threads capturing at once (the colocated topology's talker and codec
at start-up) break each other: the caching allocator records into one graph pool at a time, and a capture that
fails leaves the other's pool state inconsistent, so every later capture fails too."""


def capture(forward: Callable[[], torch.Tensor], device: torch.device, pool) -> Callable[[], torch.Tensor]:
    """Warm `forward` up on a side stream, capture it into a graph drawing on `pool`, replay it once, return a
    replay function.

    The warm-up keeps lazy set-up (library handles, device tables) out of the capture, the first replay keeps the
    graph's own first-launch cost out of serving. `thread_local` capture lets CUDA work of other threads in the
    process (another model, say) go on meanwhile; captures themselves run one at a time. The replay returns the same
    output tensor every time: copy out of it before the next replay.
    """
    with _CAPTURE_LOCK:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            output = forward()
        # A graph's first launch costs more than the later ones (the driver uploads it to the device): pay it here,
        # not in the first request's step. Same inputs as the warm-up run above, so nothing is written that it did
        # not write.
        graph.replay()
        torch.cuda.current_stream(device).synchronize()

    def replay() -> torch.Tensor:
        graph.replay()
        return output

    return replay
