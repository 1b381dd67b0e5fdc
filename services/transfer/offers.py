"""The prefill side's offers: tensors kept, by tag, until a decode replica fetched them or their time ran out.

An offer is fetchable once: `claim` takes it out of the table, so a second fetch of the same tag (a retry that
raced, a stale attempt) is told `unknown`. A claimed offer keeps its tensor until its send settled; the one timer per
offer drops it when its time runs out, whether nobody asked or the send to the asker stalled.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from messages.kv_transfer import TransferDescriptor

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Offer:
    """One offered tensor and what is known of its fetch.

    Attributes:
        descriptor: what the fetcher was told.
        tensor: the offered tensor, kept alive while UCX may read it.
        buffer: its bytes, as UCX sends them.
        ready: on CUDA, recorded after the producer's work on the current stream; the send waits for it.
        fetcher: the worker address it is being sent to, once claimed.
    """

    descriptor: TransferDescriptor
    tensor: torch.Tensor
    buffer: object
    ready: torch.cuda.Event | None
    fetcher: bytes | None = None
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)


class OfferTable:
    """Offers by tag, each with its own expiry timer on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_stalled_send: Callable[[Offer], None]) -> None:
        self._loop = loop
        self._waiting: dict[int, Offer] = {}  # offered, not yet asked for
        self._sending: set[Offer] = set()  # claimed: being sent
        self._on_stalled_send = on_stalled_send
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, offer: Offer, ttl_s: float) -> None:
        """Hold `offer` for at most `ttl_s` seconds; ValueError if its tag is already offered."""
        tag = offer.descriptor.tag
        if tag in self._waiting or any(held.descriptor.tag == tag for held in self._sending):
            raise ValueError(f"request {offer.descriptor.request_id} attempt {offer.descriptor.attempt} is already "
                             f"offered (tag {tag:#x}): offer a new attempt")
        offer.expiry = self._loop.call_later(ttl_s, self._expire, offer)
        self._waiting[tag] = offer
        self._empty.clear()

    def peek(self, tag: int) -> Offer | None:
        """The waiting offer of `tag`, left in the table."""
        return self._waiting.get(tag)

    def claim(self, tag: int, fetcher: bytes) -> Offer | None:
        """Take the waiting offer of `tag` for sending to `fetcher`; None when there is none (never offered,
        expired, already claimed)."""
        offer = self._waiting.pop(tag, None)
        if offer is not None:
            offer.fetcher = fetcher
            self._sending.add(offer)
        return offer

    def settle(self, offer: Offer) -> None:
        """The offer's send completed or failed: drop it."""
        self._sending.discard(offer)
        if self._waiting.get(offer.descriptor.tag) is offer:
            del self._waiting[offer.descriptor.tag]
        if offer.expiry is not None:
            offer.expiry.cancel()
        self._mark_if_empty()

    def _mark_if_empty(self) -> None:
        if not self._waiting and not self._sending:
            self._empty.set()

    async def drained(self) -> None:
        """Return once no offer is held."""
        await self._empty.wait()

    def _expire(self, offer: Offer) -> None:
        if self._waiting.get(offer.descriptor.tag) is offer:
            del self._waiting[offer.descriptor.tag]
            log.warning("dropped the unfetched KV offer of request %s attempt %d (%d bytes): its time ran out",
                        offer.descriptor.request_id, offer.descriptor.attempt, offer.descriptor.nbytes)
            self._mark_if_empty()
        elif offer in self._sending:
            log.warning("the send of request %s attempt %d's KV offer stalled past its time: cancelling it",
                        offer.descriptor.request_id, offer.descriptor.attempt)
            self._on_stalled_send(offer)

    def __len__(self) -> int:
        """Offers held: waiting or being sent."""
        return len(self._waiting) + len(self._sending)

    def clear(self) -> None:
        """Drop every offer (the agent closes)."""
        for offer in [*self._waiting.values(), *self._sending]:
            self.settle(offer)
