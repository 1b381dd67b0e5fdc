"""The first chunk by load (`--one-frame-first-chunk-below N`), through the decode service on a real nats-server: a
request that names no size gets one frame while fewer than N requests run on the replica, the configured size
otherwise, and a request's own size always wins. (A request taken over keeps its earlier owner's size:
test_decode_migration.py.)"""

from __future__ import annotations

from services.decode.codes_stream import ChunkRule
from tests.support.decode_stubs import running_decode, synthesis

TEXT = "hello the voice"


def ramp(initial: int, count: int) -> list[int]:
    return [ChunkRule(initial, 8).size(seq) for seq in range(count)]


async def test_a_lone_request_gets_one_frame_and_one_beside_a_running_request_the_configured_two(
        nats_server, tiny_checkpoint):
    first = synthesis("alone", TEXT, frames=120, ignore_eos=True)
    beside = synthesis("beside", TEXT, frames=12, ignore_eos=True)
    async with running_decode(nats_server.url, tiny_checkpoint, one_frame_first_chunk_below=1) as decode:
        await decode.submit(first)
        await decode.log.first_chunk(first.id)  # running now: the next request is not alone
        await decode.submit(beside)
        await decode.log.end(beside.id)
        first_end = await decode.log.end(first.id)
    assert decode.log.chunk_sizes(first.id)[:5] == ramp(1, 5)
    assert decode.log.chunk_sizes(beside.id)[:3] == ramp(2, 3)
    assert first_end.total_frames == 120


async def test_the_request_s_own_first_chunk_size_wins_and_the_setting_off_keeps_the_configured_size(
        nats_server, tiny_checkpoint):
    asks_three = synthesis("asks-three", TEXT, frames=12, initial_chunk_frames=3, ignore_eos=True)
    async with running_decode(nats_server.url, tiny_checkpoint, one_frame_first_chunk_below=4) as decode:
        await decode.submit(asks_three)
        await decode.log.end(asks_three.id)
    assert decode.log.chunk_sizes(asks_three.id)[:3] == [3, 3, 6]
    plain = synthesis("plain", TEXT, frames=12, ignore_eos=True)
    async with running_decode(nats_server.url, tiny_checkpoint, one_frame_first_chunk_below=0) as decode:  # off
        await decode.submit(plain)
        await decode.log.end(plain.id)
    assert decode.log.chunk_sizes(plain.id)[:3] == ramp(2, 3)
