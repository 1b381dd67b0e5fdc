"""This process's UCX worker for KV transfers: its address, its progress, one endpoint per peer, tagged sends and
receives that the caller can await without spinning its event loop.

Progress runs on UCX's own thread; completions reach asyncio through Python futures that a notifier thread sets on
the caller's loop (ucxx's waiting without them yields to the loop in a busy loop: a whole core per pending receive).
Nothing listens: a peer is reached by its worker address, which travels over NATS.
ucxx has no per-request cancel; closing an endpoint cancels every request posted on it, so a receive is always
posted on the endpoint to the peer that will send it, and `discard` is the cancel.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import torch
import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array
from ucxx.types import Tag, TagMaskFull

log = logging.getLogger(__name__)

_CLOSE_PERIOD_NS = 200_000_000  # how long closing an endpoint may block the loop (UCX flushes, then gives up)
_NOTIFIER_PERIOD_NS = 1_000_000_000  # how often the notifier thread looks up from its wait to see a shutdown


class UcxWorker:
    """One UCX context and worker, progressed on its own thread; endpoints cached per peer address."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._context = ucx_api.UCXContext({})
        self._worker = ucx_api.UCXWorker(self._context, enable_delayed_submission=True, enable_python_future=True)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            # UCX's CUDA transports act on the progress thread: give it this process's device context.
            self._worker.set_progress_thread_start_callback(lambda: torch.cuda.set_device(device))
        self._worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
        self._notifier = threading.Thread(target=self._notify, name="kv-transfer-ucx-notifier", daemon=True)
        self._notifier.start()
        self._endpoints: dict[bytes, ucx_api.UCXEndpoint] = {}
        self.address: bytes = self._worker.address.tobytes()

    def _notify(self) -> None:
        """Set the futures of completed requests on the loop (ucxx's notifier, owned here)."""
        asyncio.set_event_loop(self._loop)
        while True:
            self._worker.populate_python_futures_pool()
            state = self._worker.wait_request_notifier(period_ns=_NOTIFIER_PERIOD_NS)
            if state == ucx_api.PythonRequestNotifierWaitState.Shutdown:
                break
            if state == ucx_api.PythonRequestNotifierWaitState.Timeout:
                continue
            try:
                asyncio.run_coroutine_threadsafe(self._run_notifier(), self._loop)
            except RuntimeError:  # the loop closed under a worker nobody closed: nothing is left to notify
                break
        self._worker.clear_python_futures_pool()

    async def _run_notifier(self) -> None:
        self._worker.run_request_notifier()

    def endpoint(self, peer_address: bytes) -> ucx_api.UCXEndpoint:
        """The endpoint to the worker at `peer_address`: the cached one while it is alive, else a new one."""
        endpoint = self._endpoints.get(peer_address)
        if endpoint is not None and endpoint.alive:
            return endpoint
        if endpoint is not None:
            self.discard(peer_address)
        address = ucx_api.UCXAddress.create_from_buffer(peer_address)
        endpoint = ucx_api.UCXEndpoint.create_from_worker_address(self._worker, address, True)
        self._endpoints[peer_address] = endpoint
        return endpoint

    def send(self, peer_address: bytes, buffer: object, tag: int) -> ucx_api.UCXRequest:
        """Start a tagged send of `buffer` to the peer; await `.wait()` on the result for its completion."""
        return self.endpoint(peer_address).tag_send(Array(buffer), Tag(tag))

    def receive(self, peer_address: bytes, buffer: object, tag: int) -> ucx_api.UCXRequest:
        """Post a tagged receive into `buffer` of what the peer sends; `discard(peer_address)` cancels it."""
        return self.endpoint(peer_address).tag_recv(Array(buffer), Tag(tag), TagMaskFull)

    def discard(self, peer_address: bytes) -> None:
        """Close the endpoint to the peer, cancelling every request posted on it."""
        endpoint = self._endpoints.pop(peer_address, None)
        if endpoint is not None:
            endpoint.close_blocking(period=_CLOSE_PERIOD_NS, max_attempts=1)
            endpoint.remove_close_callback()

    async def close(self) -> None:
        """Close every endpoint (cancelling what is posted on them), stop the notifier and the progress thread."""
        for peer_address in list(self._endpoints):
            self.discard(peer_address)
        self._worker.stop_request_notifier_thread()
        await asyncio.to_thread(self._notifier.join)
        self._worker.stop_progress_thread()
