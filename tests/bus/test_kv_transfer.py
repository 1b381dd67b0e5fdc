"""The KV transfer (services.transfer) between processes: real nats-server, real ucxx over loopback TCP.

The offering replica is another process (`tests.support.kv_transfer_peer`); this process fetches. UCX's transports are set
explicitly (tcp and self on lo) in both, so the tests run the same on any machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import torch

from messages import subjects
from messages.codec import decode, encode
from messages.errors import TransferCode
from messages.kv_transfer import FetchReply, FetchRequest
from services.transfer.agent import KvTransferAgent
from services.transfer.descriptor import describe
from services.transfer.errors import TransferFailed
from services.transfer.tags import tag_of
from services.transfer.fetch import CANCEL_GRACE_S
from tests.support.kv_transfer_peer import big_tensor, sample_tensors

PATTERN = 0xA5  # what a receiving buffer holds before a fetch; a failed fetch must leave it so


@pytest.fixture
def ucx_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """UCX over TCP on loopback, in this process and in the peers it starts (they inherit the environment)."""
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")


class Peer:
    """An offering replica in its own process; `offers` maps a sample tensor's name to its descriptor."""

    def __init__(self, nats_url: str, replica: str, *extra: str) -> None:
        self.replica = replica
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.kv_transfer_peer", "--nats", nats_url, "--replica", replica, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        self.offers: dict[str, bytes] = {}

    async def line(self) -> str:
        """The peer's next protocol line (UCX may print its own lines first)."""
        while True:
            line = await asyncio.to_thread(self.process.stdout.readline)
            if not line:
                raise RuntimeError(f"peer {self.replica} exited (rc {self.process.wait()})")
            if line.split()[:1] in (["OFFER"], ["READY"], ["COUNT"], ["DRAINED"], ["CLOSED"]):
                return line.strip()

    async def ready(self) -> Peer:
        while (line := await self.line()) != "READY":
            _, name, descriptor = line.split()
            self.offers[name] = bytes.fromhex(descriptor)
        return self

    async def count(self) -> int:
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int((await self.line()).split()[1])

    async def drained(self) -> None:
        """Return once the peer holds no offer (each fetched and its send completed, or dropped)."""
        self.process.stdin.write("drained\n")
        self.process.stdin.flush()
        assert await asyncio.wait_for(self.line(), 30) == "DRAINED"

    async def quit(self) -> None:
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        assert await self.line() == "CLOSED"
        assert await asyncio.to_thread(self.process.wait, 30) == 0

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


@pytest.fixture
async def peers(nats_server, ucx_loopback) -> AsyncIterator:
    """Start offering peers with `await peers(replica, *args)`; every one is killed after the test."""
    started: list[Peer] = []

    async def start(replica: str, *extra: str) -> Peer:
        peer = Peer(nats_server.url, replica, *extra)
        started.append(peer)
        return await peer.ready()

    yield start
    for peer in started:
        if peer.process.poll() is None:
            os.kill(peer.process.pid, signal.SIGCONT)
        peer.kill()


@pytest.fixture
async def fetcher(nats_client, ucx_loopback) -> AsyncIterator[KvTransferAgent]:
    """This process's agent, as a decode replica's: it fetches, offers nothing."""
    agent = await KvTransferAgent.start(nats_client, "decode-test", offers=False)
    yield agent
    await agent.close()


def patterned_like(tensor: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(tensor)
    out.reshape(-1).view(torch.uint8).fill_(PATTERN)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                      b.reshape(-1).view(torch.uint8))


def untouched(out: torch.Tensor) -> bool:
    return bool((out.reshape(-1).view(torch.uint8) == PATTERN).all())


async def test_offered_tensors_arrive_bit_equal_in_another_process(peers, fetcher):
    peer = await peers("prefill-a")
    expected = sample_tensors()
    for name, tensor in expected.items():
        offer = describe(peer.offers[name])
        assert (offer.dtype, offer.shape, offer.nbytes) == (str(tensor.dtype).removeprefix("torch."),
                                                            list(tensor.shape), tensor.numel() * tensor.element_size())
        out = patterned_like(tensor)
        await fetcher.fetch(peer.offers[name], out, timeout_s=30)
        assert same_bits(out, tensor), name
    assert expected["odd_u8"].numel() % 8 and (expected["odd_bf16"].numel() * 2) % 8
    await peer.drained()  # each offer dropped once its send completed (a moment after the data arrived here)
    assert await peer.count() == 0
    await peer.quit()


async def test_two_concurrent_fetches_between_the_same_agents_both_arrive(peers, fetcher):
    peer = await peers("prefill-b")
    expected = sample_tensors()
    outs = {name: patterned_like(expected[name]) for name in ("bf16", "f32")}
    await asyncio.gather(*(fetcher.fetch(peer.offers[name], out, timeout_s=30) for name, out in outs.items()))
    assert all(same_bits(out, expected[name]) for name, out in outs.items())
    # the endpoint both used is still good for a third
    odd = patterned_like(expected["odd_u8"])
    await fetcher.fetch(peer.offers["odd_u8"], odd, timeout_s=30)
    assert same_bits(odd, expected["odd_u8"])
    await peer.quit()


async def test_a_stale_attempt_or_a_second_fetch_is_unknown_at_once(peers, fetcher):
    peer = await peers("prefill-c", "--attempt", "1")
    tensor = sample_tensors()["f32"]
    offer = describe(peer.offers["f32"])
    stale = encode(msgspec.structs.replace(offer, attempt=0, tag=tag_of(offer.request_id, 0)))
    out = patterned_like(tensor)
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(stale, out, timeout_s=30)
    assert failed.value.code == TransferCode.UNKNOWN and failed.value.out_released
    assert time.monotonic() - started < 5 and untouched(out)
    await fetcher.fetch(peer.offers["f32"], out, timeout_s=30)  # the current attempt still arrives
    assert same_bits(out, tensor)
    with pytest.raises(TransferFailed) as again:
        await fetcher.fetch(peer.offers["f32"], patterned_like(tensor), timeout_s=30)
    assert again.value.code == TransferCode.UNKNOWN
    await peer.quit()


async def test_a_stopped_peer_trips_the_watchdog_and_the_buffer_is_untouched(peers, fetcher):
    peer = await peers("prefill-d")
    os.kill(peer.process.pid, signal.SIGSTOP)
    out = patterned_like(sample_tensors()["bf16"])
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(peer.offers["bf16"], out, timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert failed.value.code == TransferCode.STALLED and failed.value.out_released
    assert 1.5 <= elapsed < 1.5 + CANCEL_GRACE_S + 1.0 and untouched(out)


async def test_a_peer_that_answers_but_never_sends_trips_the_watchdog_and_the_receive_is_cancelled(peers, fetcher):
    peer = await peers("prefill-e", "--silent-as", "prefill-e-silent")
    expected = sample_tensors()
    out = patterned_like(expected["bf16"])
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(peer.offers["bf16"], out, timeout_s=1.5)
    assert failed.value.code == TransferCode.STALLED and failed.value.out_released
    assert time.monotonic() - started < 1.5 + CANCEL_GRACE_S + 1.0 and untouched(out)
    # the cancelled receive is gone: a new endpoint to the same peer carries the next transfer, into the same buffer
    real = describe(peer.offers["f32"])
    f32 = patterned_like(expected["f32"])
    await fetcher.fetch(encode(msgspec.structs.replace(real, replica="prefill-e")), f32, timeout_s=30)
    assert same_bits(f32, expected["f32"]) and untouched(out)
    await peer.quit()


async def test_a_peer_stopped_once_its_send_started_trips_the_watchdog_and_the_receive_is_cancelled(
        peers, fetcher, nats_client):
    """The fetch reaches the peer through a front (this test) that passes the request on, so the peer starts its
    send and answers, then stops the peer (SIGSTOP) before handing the answer back: the fetch posts its receive for
    data that is in flight (or queued) and stays so. The watchdog fires in time and closing the endpoint settles
    the receive, so the buffer is released (a stop mid-way would leave part of the data in it: what a caller's
    staging buffer is for)."""
    peer = await peers("prefill-i", "--big")

    async def stop_after_the_send_started(msg) -> None:
        answer = await nats_client.request(subjects.kv_transfer("prefill-i"), msg.data, timeout=30)
        os.kill(peer.process.pid, signal.SIGSTOP)
        await msg.respond(answer.data)

    await nats_client.subscribe(subjects.kv_transfer("prefill-i-front"), cb=stop_after_the_send_started)
    offer = describe(peer.offers["big"])
    out = patterned_like(big_tensor())
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(encode(msgspec.structs.replace(offer, replica="prefill-i-front")), out, timeout_s=2)
    assert failed.value.code == TransferCode.STALLED and failed.value.out_released
    assert time.monotonic() - started < 2 + CANCEL_GRACE_S + 1.0 and fetcher.num_fenced == 0


async def test_a_peer_killed_once_its_send_started_fails_the_fetch_before_the_watchdog(peers, fetcher, nats_client):
    """As above, but the peer is killed: UCX sees its connection drop, so the fetch fails `unreachable` at once
    instead of waiting for the watchdog, and the buffer is released."""
    peer = await peers("prefill-j", "--big")

    async def kill_after_the_send_started(msg) -> None:
        answer = await nats_client.request(subjects.kv_transfer("prefill-j"), msg.data, timeout=30)
        peer.kill()
        await msg.respond(answer.data)

    await nats_client.subscribe(subjects.kv_transfer("prefill-j-front"), cb=kill_after_the_send_started)
    offer = describe(peer.offers["big"])
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(encode(msgspec.structs.replace(offer, replica="prefill-j-front")),
                            patterned_like(big_tensor()), timeout_s=20)
    assert failed.value.code == TransferCode.UNREACHABLE and failed.value.out_released
    assert time.monotonic() - started < 10 and fetcher.num_fenced == 0


async def test_a_killed_peer_fails_the_fetch_clearly(peers, fetcher):
    peer = await peers("prefill-f")
    peer.kill()
    out = patterned_like(sample_tensors()["f32"])
    with pytest.raises(TransferFailed) as failed:
        await fetcher.fetch(peer.offers["f32"], out, timeout_s=3)
    # the server notices the dead connection at once (no responders) unless the request beats it there (no answer)
    assert failed.value.code in (TransferCode.UNREACHABLE, TransferCode.STALLED)
    assert "prefill-f" in str(failed.value) and untouched(out)


class _Dropped(logging.Handler):
    """Sets `event` when the offers' log says an unfetched offer was dropped."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__(logging.WARNING)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("dropped the unfetched KV offer"):
            self.event.set()


async def test_an_unfetched_offer_is_dropped_when_its_time_runs_out(nats_client, fetcher):
    offering = await KvTransferAgent.start(nats_client, "prefill-g", offers=True)
    dropped = asyncio.Event()
    handler = _Dropped(dropped)
    logging.getLogger("services.transfer.offers").addHandler(handler)
    try:
        tensor = sample_tensors()["bf16"]
        descriptor = offering.offer("req-ttl", 0, tensor, ttl_s=0.2)
        assert offering.num_offers == 1
        await asyncio.wait_for(dropped.wait(), 10)
        assert offering.num_offers == 0
        with pytest.raises(TransferFailed) as failed:
            await fetcher.fetch(descriptor, patterned_like(tensor), timeout_s=10)
        assert failed.value.code == TransferCode.UNKNOWN
    finally:
        logging.getLogger("services.transfer.offers").removeHandler(handler)
        await offering.close()


async def test_bad_descriptors_and_wrong_sizes_fail_before_anything_is_asked(nats_client, fetcher):
    offering = await KvTransferAgent.start(nats_client, "prefill-h", offers=True)
    try:
        tensor = sample_tensors()["f32"]
        descriptor = offering.offer("req-sizes", 0, tensor, ttl_s=60)
        with pytest.raises(TransferFailed) as malformed:
            await fetcher.fetch(b"\x01not a descriptor", patterned_like(tensor), timeout_s=10)
        assert malformed.value.code == TransferCode.MALFORMED
        smaller = torch.full((tensor.numel() - 1,), 0.0)
        with pytest.raises(TransferFailed) as mismatch:
            await fetcher.fetch(descriptor, smaller, timeout_s=10)
        assert mismatch.value.code == TransferCode.MISMATCH and offering.num_offers == 1
        # an asker that lies about its size is refused by the offering side, and the offer stays
        lying = encode(msgspec.structs.replace(describe(descriptor), nbytes=smaller.numel() * 4,
                                               shape=list(smaller.shape)))
        with pytest.raises(TransferFailed) as refused:
            await fetcher.fetch(lying, smaller, timeout_s=10)
        assert refused.value.code == TransferCode.MISMATCH and offering.num_offers == 1
        with pytest.raises(ValueError, match="already offered"):
            offering.offer("req-sizes", 0, tensor, ttl_s=60)
        with pytest.raises(ValueError, match="contiguous"):
            offering.offer("req-sizes", 1, tensor.transpose(0, 2), ttl_s=60)
    finally:
        await offering.close()
    assert offering.num_offers == 0


async def test_a_send_to_an_asker_that_never_receives_is_cancelled_when_the_offers_time_runs_out(nats_client, fetcher):
    """An asker that asks and then never posts its receive (stopped, or a bug): the send cannot complete (the data
    goes by rendezvous), so the offer's time running out cancels it, and the offering replica drains."""
    offering = await KvTransferAgent.start(nats_client, "prefill-k", offers=True)
    try:
        tensor = sample_tensors()["f32"]
        offered_at = time.monotonic()
        offer = describe(offering.offer("req-asker-gone", 0, tensor, ttl_s=0.5))
        ask = FetchRequest(tag=offer.tag, nbytes=offer.nbytes, worker_address=fetcher.worker_address)
        answer = await nats_client.request(subjects.kv_transfer("prefill-k"), encode(ask), timeout=10)
        assert decode(answer.data, FetchReply).refusal is None and offering.num_offers == 1
        await asyncio.wait_for(offering.drained(), 10)
        assert offering.num_offers == 0 and time.monotonic() - offered_at >= 0.5  # dropped by its time, not a send
    finally:
        await offering.close()
