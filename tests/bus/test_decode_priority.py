"""Priorities and fair share at one decode replica, against a real nats-server: requests published on their lanes as
the gateway publishes them (issue 42 items 2 and 3)."""

from __future__ import annotations

import asyncio

from messages import subjects
from messages.events import Started
from tests.support.decode_stubs import running_decode, synthesis

pytestmark = __import__("pytest").mark.asyncio


def _started(decode, request_id: str) -> Started:
    [started] = [e for e in decode.log.events[request_id] if isinstance(e, Started)]
    return started


def _tenants_in_two_lanes() -> tuple[str, str]:
    first = "acme"
    other = next(f"globex-{n}" for n in range(64)
                 if subjects.tenant_lane(f"globex-{n}") != subjects.tenant_lane(first))
    return first, other


async def test_an_interactive_request_gets_a_kept_seat_while_a_batch_key_floods(nats_server, tiny_checkpoint):
    """Two seats, one kept for interactive work: a batch flood holds the other; the interactive request starts and
    ends while the first batch request still runs, and every batch request completes."""
    batch = [synthesis(f"book-{n}", "a chapter read aloud", frames=120, tenant="reader", priority="batch")
             for n in range(3)]
    interactive = synthesis("agent-1", "hello there", frames=4, tenant="agent")
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=2, interactive_share=0.5,
                              runaway_min_frames=1000) as decode:
        for request in batch:
            await decode.submit_in_lane(request)
        await decode.log.first_chunk(batch[0].id)
        await decode.submit_in_lane(interactive)
        first_batch_end = asyncio.ensure_future(decode.log.end(batch[0].id))
        interactive_end = await decode.log.end(interactive.id)
        assert not first_batch_end.done(), "the interactive request waited for a batch request to end"
        ends = [await decode.log.end(request.id) for request in batch]
    assert interactive_end.error is None and all(end.error is None for end in ends)


async def test_waiting_batch_work_keeps_one_seat_under_an_interactive_flood(nats_server, tiny_checkpoint):
    """No starvation: interactive requests flood both seats' worth and more, a batch request starts before they
    are all done (the batch floor)."""
    flood = [synthesis(f"chat-{n}", "a quick answer", frames=30, tenant="agent") for n in range(6)]
    book = synthesis("book-0", "a chapter read aloud", frames=4, tenant="reader", priority="batch")
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=2, interactive_share=0.5,
                              runaway_min_frames=1000) as decode:
        for request in flood:
            await decode.submit_in_lane(request)
        await decode.submit_in_lane(book)
        book_end = await decode.log.end(book.id)
        assert flood[-1].id not in decode.log._end, "the batch request waited for the whole interactive flood"
        ends = [await decode.log.end(request.id) for request in flood]
    assert book_end.error is None and all(end.error is None for end in ends)


async def test_two_flooding_batch_keys_take_turns_not_first_come_first_served(nats_server, tiny_checkpoint):
    """One seat; key A's whole burst is queued before key B's: decode still alternates between them."""
    first, second = _tenants_in_two_lanes()
    burst_a = [synthesis(f"a-{n}", "some words", frames=3, tenant=first, priority="batch") for n in range(6)]
    burst_b = [synthesis(f"b-{n}", "some words", frames=3, tenant=second, priority="batch") for n in range(6)]
    async with running_decode(nats_server.url, tiny_checkpoint, max_num_seqs=1) as decode:
        for request in burst_a + burst_b:
            await decode.submit_in_lane(request)
        for request in burst_a + burst_b:
            assert (await decode.log.end(request.id)).error is None
    order = sorted(burst_a + burst_b, key=lambda r: _started(decode, r.id).at)
    first_half = [r.tenant for r in order[:6]]
    # first-come-first-served would start A's six first; turns give each key about half of every stretch
    assert 2 <= first_half.count(second) <= 4, [r.id for r in order]
