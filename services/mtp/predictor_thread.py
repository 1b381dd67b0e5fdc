"""The one thread that runs the replica's torch work, so the event loop stays free for requests and the lease."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


class PredictorWorker:
    """A single-thread executor: steps are computed one at a time, in the order they were queued."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtp-predictor")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(_inference, fn, args))

    def close(self) -> None:
        """Wait for the call in progress (if any) and stop the thread."""
        self._executor.shutdown(wait=True, cancel_futures=True)


def _inference(fn: Callable[..., T], args: tuple) -> T:
    with torch.inference_mode():
        return fn(*args)
