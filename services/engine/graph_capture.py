"""Capturing padded steps as CUDA graphs, with the eager step as the fallback where a capture fails.

A step that cannot be captured gives the same results run eagerly, only with more launches, so a failed capture
must not take a replica down. It is not retried either: a failed capture can leave the caching allocator's graph
pool inconsistent (see `services.model.cuda_graph`), so from the first failure on every step runs eagerly.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from services.model import cuda_graph

Step = Callable[[], torch.Tensor]
"""A step over static inputs: the eager forward, or the replay of its captured graph."""


class GraphCapture:
    """Captures one owner's steps into one shared graph pool, until the first capture that fails."""

    def __init__(self, device: torch.device, is_capturing: bool, log: logging.Logger) -> None:
        """`is_capturing` False hands every step back eagerly (the CPU path); `log` is the owner's logger, so a
        failure is reported under the module whose step it was."""
        self.device = device
        self.is_capturing = is_capturing
        """Whether steps are still captured: False from the first failed capture on."""
        self.pool = torch.cuda.graph_pool_handle() if is_capturing else None
        self.num_failures = 0
        """Captures that failed (logged; the owners report it in the stats as `num_capture_failures`)."""
        self._log = log

    def graph_or_eager(self, forward: Step, step_name: str) -> Step:
        """The replay of `forward` captured as a graph, or `forward` itself when not capturing or when the capture
        raises; `step_name` says which step in the log (e.g. "the sampling step (rows bucket 4, ...)")."""
        if not self.is_capturing:
            return forward
        try:
            return cuda_graph.capture(forward, self.device, self.pool)
        except RuntimeError:
            self._log.exception("capturing %s failed; it and every later step run eagerly (same results, "
                                "more launches)", step_name)
            self.is_capturing = False
            self.num_failures += 1
            return forward
