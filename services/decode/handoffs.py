"""Requests prefilled remotely, decode's side: fetch the prompt's KV into a staging buffer, then continue.

A `PrefillHandoff` comes through decode's own consumer (with requests; one consumer, so a replica's room is never
promised twice), and is owned exactly as a request is (claim, marker, ack). Then the prompt's KV is fetched by UCX from
the prefill replica into a buffer of this replica's (never into the live pool: the engine writes it into the request's
blocks when the request is first scheduled), and the request joins the engine with its first frame, so it computes one
token instead of its prompt. If the KV cannot be had (the prefill replica died or restarted, the KV expired, the
transfer stalled past its watchdog), nothing is lost: the request is prefilled here, replaying the first frame exactly,
as after a preemption. A hand-off made from another checkpoint is used not at all, first frame included: the request is
prefilled here from its prompt. The agent (a UCX worker) starts with the first hand-off, so replicas that never get one
never start UCX.
"""

from __future__ import annotations

import asyncio
import logging

from typing import TYPE_CHECKING

import numpy as np
import torch

from messages.mtp import PrefillHandoff
from services.decode.core import DecodeCore
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.transfer.errors import TransferFailed

if TYPE_CHECKING:
    from services.transfer.agent import KvTransferAgent

log = logging.getLogger(__name__)


class HandoffFetcher:
    """Fetches handed-over prompt KV for one decode replica; counts what happened."""

    def __init__(self, core: DecodeCore) -> None:
        self.core = core
        self._agent: KvTransferAgent | None = None
        self._starting = asyncio.Lock()
        self._own_fingerprint: str | None = None
        self.num_fetched = 0
        self.num_failed = 0

    async def made_here(self, handoff: PrefillHandoff) -> bool:
        """Whether the hand-off was made from this replica's checkpoint. Another's KV and first frame are not this
        model's: the request is then prefilled here from its prompt alone, as if it had never been to prefill."""
        if handoff.fingerprint == await self._fingerprint():
            return True
        self.num_failed += 1
        log.warning("request %s: its hand-off was made from another checkpoint (%s, not %s); prefilling it here "
                    "from the prompt", handoff.request.id, handoff.fingerprint, self._own_fingerprint)
        return False

    async def fetch(self, handoff: PrefillHandoff) -> torch.Tensor | None:
        """The prompt's KV as pool blocks, or None when it could not be had (then the request prefills here,
        continuing from the hand-off's first frame). Call `made_here` first."""
        core = self.core
        staging = core.engine.kv_staging(handoff.prompt_tokens)
        try:
            agent = await self._started()
        except ImportError as exc:
            self.num_failed += 1
            log.error("request %s: decode cannot fetch handed-over KV without ucxx (%s): install voxmesh[ucx]; "
                      "prefilling it here", handoff.request.id, exc)
            return None
        try:
            await agent.fetch(handoff.transfer, staging, core.settings.handoff_timeout_s)
        except TransferFailed as exc:
            self.num_failed += 1
            log.warning("request %s: its prompt KV could not be fetched from %s (%s: %s); prefilling it here",
                        handoff.request.id, handoff.prefill_replica, exc.code, exc)
            return None
        self.num_fetched += 1
        return staging

    async def _fingerprint(self) -> str:
        """This replica's checkpoint fingerprint, read once (off the event loop: it reads the weight files)."""
        if self._own_fingerprint is None:
            self._own_fingerprint = await asyncio.to_thread(checkpoint_fingerprint, self.core.settings.model_dir)
        return self._own_fingerprint

    async def _started(self) -> KvTransferAgent:
        from services.transfer.agent import KvTransferAgent  # ucxx: imported by the first hand-off only

        async with self._starting:
            if self._agent is None:
                self._agent = await KvTransferAgent.start(self.core.nc, self.core.replica, offers=False)
            return self._agent

    async def close(self) -> None:
        if self._agent is not None:
            await self._agent.close()


def first_frame(handoff: PrefillHandoff) -> np.ndarray:
    """The prefill's first frame, int64 [1, 16] (the `frames` the engine continues from)."""
    return np.asarray(handoff.first_frame, dtype=np.int64)[None]
