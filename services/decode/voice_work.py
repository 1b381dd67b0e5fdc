"""Where a cloned voice's reference-audio work runs: a thread beside the step loop, or a process of its own.

On a GPU the work is a few milliseconds of device time behind hundreds of small eager launches (the mel, the
speaker encoder's CNN, the codec encoder's convolutions and transformer), so tens of milliseconds of Python a
reference. On a thread of the decode process that Python holds the interpreter lock the step thread and the event
loop need, and many new voices a second stall decode's frames. So on CUDA it runs in child processes (spawned: CUDA
cannot be forked), `voice_workers` of them, each loading only the speaker and codec encoders
(`VoiceCloner.from_directory`) and answering one prompt at a time; its prompts, a few kB of CPU tensors, come back
pickled. More children serve more references at once, each with its own interpreter and launch queue, so a burst of
new references queues less (the default is two). On the CPU the work is torch compute that releases the lock, and a
thread serves as well without a second copy of the encoders.

A child that dies (killed, out of memory) fails the prompts in flight with `VoiceWorkLost` and is started again for
the next one.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from services.decode.worker import EngineWorker
from services.model.voice.cloner import TextEncoder, VoiceCloner
from services.model.voice.voice_prompt import VoicePrompt

log = logging.getLogger(__name__)

class VoiceWorkLost(RuntimeError):
    """The reference-audio process died while computing this prompt (it is restarted for the next one)."""


class PromptMaker(Protocol):
    """Computes voice prompts off the step loop."""

    tokenizer: TextEncoder

    async def make_prompt(self, samples: np.ndarray, sample_rate: int, ref_text: str | None,
                          x_vector_only: bool) -> VoicePrompt: ...

    def close(self) -> None: ...


class ThreadPromptMaker:
    """The work on a thread of this process, with the cloner this process loaded."""

    def __init__(self, cloner: VoiceCloner) -> None:
        self.cloner, self.tokenizer = cloner, cloner.tokenizer
        self._thread = EngineWorker("decode-voice")

    async def make_prompt(self, samples: np.ndarray, sample_rate: int, ref_text: str | None,
                          x_vector_only: bool) -> VoicePrompt:
        return await self._thread.run(self.cloner.make_prompt, samples, sample_rate, ref_text, x_vector_only)

    def close(self) -> None:
        self._thread.close()


_CLONER: VoiceCloner | None = None
"""The child process's cloner (loaded by `_load_cloner` when the child starts)."""

_LOADED = None
"""The children's shared count of loaded cloners (a multiprocessing Value), in every child."""


def _load_cloner(directory: str, dtype: str, device: str, loaded) -> None:
    global _CLONER, _LOADED
    torch.set_num_threads(1)
    with torch.inference_mode():
        _CLONER = VoiceCloner.from_directory(directory, getattr(torch, dtype), device)
    _LOADED = loaded
    with loaded.get_lock():
        loaded.value += 1


def _child_prompt(samples: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
    assert _CLONER is not None, "the reference-audio process has no cloner"
    return _CLONER.make_prompt(samples, sample_rate, ref_text, x_vector_only)


def _children_ready(workers: int) -> bool:
    """True once `workers` children have loaded their cloners (a child that dies meanwhile breaks the pool, and the
    caller's future with it)."""
    while _LOADED.value < workers:
        time.sleep(0.01)
    return _CLONER is not None


class ProcessPromptMaker:
    """The work in a spawned child process holding its own speaker and codec encoders."""

    def __init__(self, directory: str | Path, dtype: torch.dtype, device: str, tokenizer: TextEncoder,
                 workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.tokenizer, self.workers = tokenizer, workers
        self._args = (str(directory), str(dtype).removeprefix("torch."), device)
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=context, initializer=_load_cloner,
                                   initargs=(*self._args, context.Value("i", 0)))

    async def ready(self) -> None:
        """Wait until every child has loaded its encoders (start-up: the first voices must not pay for it). The
        executor starts a child for each call made while none is idle, so one call per child starts them all."""
        await asyncio.gather(*(asyncio.wrap_future(self._pool.submit(_children_ready, self.workers))
                               for _ in range(self.workers)))

    async def make_prompt(self, samples: np.ndarray, sample_rate: int, ref_text: str | None,
                          x_vector_only: bool) -> VoicePrompt:
        pool = self._pool
        try:
            return await asyncio.wrap_future(pool.submit(_child_prompt, samples, sample_rate, ref_text,
                                                         x_vector_only))
        except BrokenProcessPool as exc:
            if self._pool is pool:  # the first to see it starts the next child
                log.error("the reference-audio process died; starting another")
                self._pool = self._start()
            raise VoiceWorkLost("the reference-audio process died while computing this voice; retry the "
                                "request") from exc

    @property
    def process_ids(self) -> list[int]:
        """The living children's pids (none before they start): for an operator's diagnostics and the tests."""
        return [process.pid for process in (self._pool._processes or {}).values() if process.is_alive()]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def uses_process(mode: str, device: str) -> bool:
    """Whether `voice_work` (auto, thread or process) puts the work in a child process on `device`."""
    return mode == "process" or (mode == "auto" and device.startswith("cuda"))
