"""The offering side's NATS endpoint: a fetch request names a tag and the asker's worker address; the offer is
claimed, its tagged send started, and the reply says so (or why not). The offer is dropped once the send settled.

The reply goes out after the send started, not after it completed: a large message goes by rendezvous, which
completes only once the asker has posted its receive, and the asker posts it when the reply says the data is coming.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg

from messages.codec import decode, encode
from messages.errors import DecodeError, TransferCode
from messages.kv_transfer import FetchReply, FetchRequest
from services.transfer.offers import Offer, OfferTable
from services.transfer.ucx_worker import UcxWorker

log = logging.getLogger(__name__)


class Sender:
    """Answers fetch requests for the offers in `offers`, sending over `worker`."""

    def __init__(self, worker: UcxWorker, offers: OfferTable) -> None:
        self._worker = worker
        self._offers = offers
        self._sends: set[asyncio.Task] = set()

    async def answer(self, msg: Msg) -> None:
        """One fetch request, answered at once."""
        reply = self._start(msg.data)
        await msg.respond(encode(reply))

    def _start(self, data: bytes) -> FetchReply:
        try:
            request = decode(data, FetchRequest)
        except DecodeError as exc:
            return FetchReply(refusal=TransferCode.MALFORMED, message=str(exc))
        waiting = self._offers.peek(request.tag)
        if waiting is not None and waiting.descriptor.nbytes != request.nbytes:
            return FetchReply(refusal=TransferCode.MISMATCH,
                              message=f"the offer is {waiting.descriptor.nbytes} bytes, the asker expects "
                                      f"{request.nbytes}")
        offer = self._offers.claim(request.tag, request.worker_address)
        if offer is None:
            return FetchReply(refusal=TransferCode.UNKNOWN,
                              message=f"no offer of tag {request.tag:#x} here (expired, already fetched, or this "
                                      f"replica restarted)")
        if offer.ready is not None:
            offer.ready.synchronize()  # the producer's kernels finished long ago: a prefill precedes its hand-off
        try:
            send = self._worker.send(request.worker_address, offer.buffer, offer.descriptor.tag)
        except Exception as exc:  # UCX refuses the address or the endpoint: the asker is gone
            self._offers.settle(offer)
            return FetchReply(refusal=TransferCode.UNREACHABLE, message=f"UCX could not reach the asker: {exc}")
        task = asyncio.get_running_loop().create_task(self._finish(offer, send.wait()))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        return FetchReply()

    async def _finish(self, offer: Offer, send: object) -> None:
        try:
            await send
        except Exception as exc:  # the asker died or gave up (closed its endpoint), or the offer's time ran out
            log.warning("the send of request %s attempt %d's KV offer failed: %s", offer.descriptor.request_id,
                        offer.descriptor.attempt, exc)
        finally:
            self._offers.settle(offer)

    def cancel_stalled(self, offer: Offer) -> None:
        """The offer's time ran out mid-send: close the endpoint to its fetcher, which cancels the send; the offer
        is dropped when the send settles (UCX may read its tensor until then)."""
        if offer.fetcher is not None:
            self._worker.discard(offer.fetcher)

    async def close(self) -> None:
        """Cancel the sends still waiting (their endpoints are closed by the worker)."""
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
