"""The decode side of a transfer: ask the offering replica over NATS, then receive its tagged send into the
caller's buffer, all within one deadline (the watchdog).

Nothing is posted into the buffer until the offering replica said the data is on its way, so a refusal, or a dead
or stopped replica that never answered, leaves the buffer untouched. A receive that the deadline overtakes is
cancelled by closing the endpoint it was posted on (ucxx has no per-request cancel); if UCX does not settle it even
then, the buffer stays referenced here (fenced) until it does, and the error says the caller must not reuse it.
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import torch
from nats.aio.client import Client
from ucxx.exceptions import UCXCanceledError, UCXMessageTruncatedError

from messages import subjects
from messages.codec import decode, encode
from messages.errors import DecodeError, TransferCode
from messages.kv_transfer import FetchReply, FetchRequest, TransferDescriptor
from services.transfer.buffers import byte_view
from services.transfer.descriptor import describe
from services.transfer.errors import TransferFailed
from services.transfer.ucx_worker import UcxWorker

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 0.5  # how long a fetch waits, past its deadline, for UCX to settle the receive it cancelled


class Fetcher:
    """Fetches offered tensors over `worker`, asking their replicas on `nc`."""

    def __init__(self, nc: Client, worker: UcxWorker) -> None:
        self._nc = nc
        self._worker = worker
        self._fenced: dict[asyncio.Future, torch.Tensor] = {}  # receives not settled, and the buffers they hold

    async def fetch(self, descriptor: bytes, out: torch.Tensor, timeout_s: float) -> None:
        """Receive the offer of `descriptor` into `out` within `timeout_s`; TransferFailed otherwise."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        offer = describe(descriptor)
        out_nbytes = out.numel() * out.element_size()
        if out_nbytes != offer.nbytes:
            raise TransferFailed(TransferCode.MISMATCH, f"the offer of request {offer.request_id} is {offer.nbytes} "
                                                        f"bytes, the receiving buffer {out_nbytes}")
        buffer = byte_view(out)
        reply = await self._ask(offer, deadline - loop.time())
        if reply.refusal is not None:
            raise TransferFailed(reply.refusal, f"replica {offer.replica} refused: {reply.message}")
        await self._receive(offer, buffer, out, deadline)

    async def _ask(self, offer: TransferDescriptor, timeout_s: float) -> FetchReply:
        request = FetchRequest(tag=offer.tag, nbytes=offer.nbytes, worker_address=self._worker.address)
        subject = subjects.kv_transfer(offer.replica)
        try:
            answer = await self._nc.request(subject, encode(request), timeout=max(timeout_s, 0.001))
        except nats.errors.NoRespondersError as exc:
            raise TransferFailed(TransferCode.UNREACHABLE, f"no replica answers on {subject}: {offer.replica} is "
                                                           f"gone") from exc
        except nats.errors.TimeoutError as exc:
            raise TransferFailed(TransferCode.STALLED, f"replica {offer.replica} did not answer within "
                                                       f"{timeout_s:.3f} s") from exc
        try:
            return decode(answer.data, FetchReply)
        except DecodeError as exc:
            raise TransferFailed(TransferCode.MALFORMED, f"replica {offer.replica}'s reply: {exc}") from exc

    async def _receive(self, offer: TransferDescriptor, buffer: object, out: torch.Tensor, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            request = self._worker.receive(offer.worker_address, buffer, offer.tag)
        except Exception as exc:  # UCX refused the address or could not make an endpoint to it
            raise TransferFailed(TransferCode.UNREACHABLE, f"UCX cannot reach replica {offer.replica}: "
                                                           f"{exc}") from exc
        landing = asyncio.ensure_future(request.wait())
        try:
            done, _ = await asyncio.wait({landing}, timeout=max(deadline - loop.time(), 0.0))
        except asyncio.CancelledError:
            await self._cancel(offer, landing, out)
            raise
        if landing in done:
            _raise_failure(offer, landing.exception())
            return
        released = await self._cancel(offer, landing, out)
        raise TransferFailed(TransferCode.STALLED, f"the KV of request {offer.request_id} from replica "
                                                   f"{offer.replica} did not arrive in time", out_released=released)

    async def _cancel(self, offer: TransferDescriptor, landing: asyncio.Future, out: torch.Tensor) -> bool:
        """Cancel the posted receive; whether it settled (else `out` stays fenced until it does)."""
        self._worker.discard(offer.worker_address)
        settled, _ = await asyncio.wait({landing}, timeout=CANCEL_GRACE_S)
        if landing in settled:
            landing.exception()  # retrieved: a cancelled receive's error is expected
            return True
        log.error("the cancelled receive of request %s's KV did not settle: its buffer stays fenced until it does",
                  offer.request_id)
        self._fenced[landing] = out
        landing.add_done_callback(lambda settled_landing: self._fenced.pop(settled_landing, None))
        return False

    @property
    def num_fenced(self) -> int:
        """Buffers held because their cancelled receives have not settled."""
        return len(self._fenced)


def _raise_failure(offer: TransferDescriptor, exc: BaseException | None) -> None:
    """Raise the TransferFailed of a receive that ended with `exc` (nothing when it succeeded)."""
    if exc is None:
        return
    if isinstance(exc, UCXMessageTruncatedError):
        raise TransferFailed(TransferCode.MISMATCH, f"replica {offer.replica} sent more than the {offer.nbytes} "
                                                    f"bytes offered") from exc
    if isinstance(exc, UCXCanceledError):
        raise TransferFailed(TransferCode.STALLED, f"the receive from replica {offer.replica} was cancelled: its "
                                                   f"endpoint closed after another transfer from it stalled") from exc
    raise TransferFailed(TransferCode.UNREACHABLE, f"UCX lost replica {offer.replica} mid-transfer: {exc}") from exc
