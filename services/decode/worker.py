"""The one thread that touches torch and the engine.

Every engine call (add, step, abort, drain) and every tensor operation runs here, one at a time, so the engine
needs no locks and the event loop stays free for NATS heartbeats, acks and publishes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


class EngineWorker:
    """A single-thread executor; `await worker.run(fn, *args)` runs `fn` there under torch.inference_mode."""

    def __init__(self, name: str = "decode-engine") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(_inference, fn, args, kwargs))

    def close(self) -> None:
        """Wait for the call in progress (if any) and stop the thread."""
        self._executor.shutdown(wait=True, cancel_futures=True)


def _inference(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    with torch.inference_mode():
        return fn(*args, **kwargs)
