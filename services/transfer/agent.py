"""The KV transfer agent: one per process. A prefill replica offers tensors; a decode replica fetches them.

Protocol: `offer` keeps a contiguous tensor under a tag derived from (request id, attempt) and returns its
descriptor, which travels in the hand-off. `fetch` asks the offering replica on `subjects.kv_transfer(replica)`
(a `FetchRequest`: tag, size, the asker's worker address); the offering replica claims the offer, starts a tagged
send to the asker's worker and replies (`FetchReply`: started, or `unknown`/`mismatch`); the asker then posts its
receive into its buffer. UCX worker addresses go over NATS: nothing listens.
"""

from __future__ import annotations

import asyncio

import torch
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from messages import subjects
from messages.codec import encode
from messages.kv_transfer import TransferDescriptor
from services.transfer.buffers import byte_view, dtype_name
from services.transfer.fetch import Fetcher
from services.transfer.offers import Offer, OfferTable
from services.transfer.sender import Sender
from services.transfer.tags import tag_of
from services.transfer.ucx_worker import UcxWorker


class KvTransferAgent:
    """A UCX worker (progressed on its own thread; completions reach the loop as futures, so waiting never spins
    it), its worker address, and, on an offering replica, the NATS endpoint on which peers ask for offers."""

    def __init__(self, replica: str, worker: UcxWorker, offers: OfferTable, sender: Sender, fetcher: Fetcher,
                 subscription: Subscription | None) -> None:
        self.replica = replica
        self._worker = worker
        self._offers = offers
        self._sender = sender
        self._fetcher = fetcher
        self._subscription = subscription

    @classmethod
    async def start(cls, nc: Client, replica: str, *, offers: bool) -> KvTransferAgent:
        """Start the agent of `replica` on `nc`. `offers`: whether this replica offers tensors (prefill: it answers
        on its transfer subject) or only fetches them (decode: it may not subscribe there)."""
        subjects.token(replica)
        loop = asyncio.get_running_loop()
        worker = UcxWorker(loop)
        table = OfferTable(loop, on_stalled_send=lambda offer: sender.cancel_stalled(offer))
        sender = Sender(worker, table)
        subscription = None
        if offers:
            subscription = await nc.subscribe(subjects.kv_transfer(replica), cb=sender.answer)
            await nc.flush()  # the server has the subscription before any descriptor naming it is handed off
        return cls(replica, worker, table, sender, Fetcher(nc, worker), subscription)

    @property
    def worker_address(self) -> bytes:
        """This process's UCX worker address."""
        return self._worker.address

    def offer(self, request_id: str, attempt: int, tensor: torch.Tensor, ttl_s: float) -> bytes:
        """Keep `tensor` (contiguous) until a decode replica fetched it or `ttl_s` passed (then drop it, logged).

        Returns the transfer descriptor (msgspec bytes: replica, worker address, tag, nbytes, dtype, shape) that goes
        into `PrefillHandoff.transfer`. Call it on the agent's event loop. Do not write into `tensor` while it is
        offered (`num_offers` counts what is held); on CUDA the send waits for the work queued on the current stream
        before this call. ValueError for a tensor that is not contiguous or is empty, a dtype a descriptor cannot
        name, or an attempt already offered.
        """
        if self._subscription is None:
            raise RuntimeError(f"replica {self.replica}'s agent was started with offers=False: it only fetches")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        descriptor = TransferDescriptor(
            replica=self.replica, worker_address=self._worker.address, request_id=request_id, attempt=attempt,
            tag=tag_of(request_id, attempt), nbytes=tensor.numel() * tensor.element_size(),
            dtype=dtype_name(tensor.dtype), shape=list(tensor.shape))
        ready = None
        if tensor.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        self._offers.add(Offer(descriptor, tensor, byte_view(tensor), ready), ttl_s)
        return encode(descriptor)

    async def fetch(self, descriptor: bytes, out: torch.Tensor, timeout_s: float) -> None:
        """Receive the offered tensor into `out` (preallocated, contiguous, the same number of bytes; a staging
        buffer, never live KV: its contents are whole only once this returns).

        The offering replica is asked over NATS first; the receive is posted only once it answered that the send
        started. Raises TransferFailed: `stalled` (no answer or no data within `timeout_s`: the watchdog; raised
        within `timeout_s` plus the cancellation's settling, under a second), `unknown` (the peer no longer holds
        it: expired, fetched, restarted, a stale attempt), `unreachable` (no peer answers, or UCX lost it
        mid-transfer), `mismatch` (sizes disagree), `malformed` (a bad descriptor or reply). A failure before the
        answer leaves `out` untouched; after it, `out` may hold part of the data. Either way the receive is no
        longer posted (cancelled by closing the endpoint to that peer, which fails that peer's other fetches in
        flight too), so `out` may be reused or freed, unless the error's `out_released` is False.
        """
        await self._fetcher.fetch(descriptor, out, timeout_s)

    @property
    def num_offers(self) -> int:
        """Offers held: not yet fetched, or being sent."""
        return len(self._offers)

    async def drained(self) -> None:
        """Return once no offer is held: each was fetched (its send completed) or dropped. A prefill replica that
        stops taking requests awaits this (with its own bound) before `close`, so no decode replica is left
        asking."""
        await self._offers.drained()

    @property
    def num_fenced(self) -> int:
        """Receiving buffers still held because a cancelled receive into them has not settled (normally 0)."""
        return self._fetcher.num_fenced

    async def close(self) -> None:
        """Stop answering, cancel what is in flight (closing every endpoint), drop the offers."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
        await self._worker.close()
        await self._sender.close()
        self._offers.clear()
