"""Vocoder partition takeover: a vocoder process is killed mid-request; a standby claims its partitions once its lease
lapses, rebuilds the request's codec state from CODES, and the request's audio continues exactly. Live vocoders
share the partitions: one that joins is handed its share mid-stream, and the streams continue exactly; a live
vocoder that never claims its share leaves no partition unserved."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

from messages import subjects
from messages.events import Finished
from services.bus.claims import read_partition
from services.bus.leases import LeaseKeeper
from tests.support.vocoder_stubs import (
    NUM_PARTITIONS,
    WAIT_S,
    Listener,
    StandInDecode,
    await_partitions,
    bus,  # noqa: F401 (fixture)
    codec_decoder,  # noqa: F401 (fixture)
    codec_model_dir,  # noqa: F401 (fixture)
    full_decode_pcm,
    random_codes,
    running_vocoder,
    status,
    stored_terminals,
)


async def start_vocoder_process(bus, model_dir, replica: str) -> asyncio.subprocess.Process:
    """`python -m services.vocoder` as its own process, configured through the environment."""
    env = dict(os.environ, VOXMESH_NATS_URL=bus.url, VOXMESH_MODEL_DIR=str(model_dir), VOXMESH_REPLICA=replica,
               VOXMESH_NUM_PARTITIONS=str(NUM_PARTITIONS), VOXMESH_LEASE_TTL_S="1.0", VOXMESH_TICK_S="0.2",
               VOXMESH_LOG_LEVEL="WARNING", OMP_NUM_THREADS="1")
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "services.vocoder", env=env,
                                                stdin=asyncio.subprocess.DEVNULL)


async def test_standby_takes_over_a_dead_vocoders_partitions_and_continues_the_audio(bus, codec_model_dir,
                                                                                      codec_decoder):
    codes = random_codes(20, codec_decoder.config.codebook_size, seed=30)
    process = await start_vocoder_process(bus, codec_model_dir, "vocoder-doomed")
    try:
        await asyncio.wait_for(await_partitions(bus.kv, "vocoder-doomed", range(NUM_PARTITIONS)), WAIT_S)
        stand_in = StandInDecode(bus, "req-takeover")
        listener = await Listener.open(bus.nc, "req-takeover")
        await stand_in.start()
        await stand_in.chunks(codes[:10], [2, 8])
        before = await listener.audio_chunks(2)
    finally:
        process.kill()  # SIGKILL: no drain, no release; its lease just stops being renewed
        await process.wait()
    epoch_before = (await read_partition(bus.kv, stand_in.partition)).record.epoch

    async with running_vocoder(bus, codec_model_dir, replica="vocoder-standby"):
        await stand_in.chunks(codes[10:], [8, 2])
        await stand_in.finish()
        terminal = await listener.terminal()
        claim = await read_partition(bus.kv, stand_in.partition)

    assert [c.seq for c in before] == [0, 1], "the first vocoder voiced the first two chunks"
    assert (claim.record.replica, claim.record.epoch) == ("vocoder-standby", epoch_before + 1)
    assert isinstance(terminal, Finished) and (terminal.chunk_count, terminal.frames) == (4, 20)
    expected = full_decode_pcm(codec_decoder, codes).astype(np.int32)
    by_seq = {}
    for chunk in before + listener.audio:  # a chunk voiced by both vocoders may come twice: the same samples
        start = chunk.first_sample
        got = chunk.samples().astype(np.int32)
        assert np.abs(got - expected[start:start + got.size]).max() <= 1, f"chunk {chunk.seq} splices or restarts"
        by_seq[chunk.seq] = chunk
    assert sorted(by_seq) == [0, 1, 2, 3]
    assert len(await stored_terminals(bus.js, "req-takeover")) == 1


def one_request_per_partition(prefix: str) -> dict[int, str]:
    """Partition -> a request id that hashes to it."""
    found: dict[int, str] = {}
    for index in range(1000):
        request_id = f"{prefix}-{index}"
        found.setdefault(subjects.partition_for(request_id, NUM_PARTITIONS), request_id)
        if len(found) == NUM_PARTITIONS:
            return found
    raise AssertionError("no request id for some partition")


def assert_voiced_exactly(chunks, expected: np.ndarray, num_chunks: int) -> None:
    """Every chunk seq once at least, each chunk's samples where the full decode has them (a chunk voiced by both
    vocoders may come twice: then with the same samples)."""
    by_seq = {}
    for chunk in chunks:
        got = chunk.samples().astype(np.int32)
        start = chunk.first_sample
        assert np.abs(got - expected[start:start + got.size]).max() <= 1, f"chunk {chunk.seq} splices or restarts"
        by_seq[chunk.seq] = chunk
    assert sorted(by_seq) == list(range(num_chunks))


async def test_a_vocoder_that_joins_is_handed_its_share_mid_stream_and_the_streams_continue_exactly(
        bus, codec_model_dir, codec_decoder):
    requests = one_request_per_partition("req-share")
    codes = {p: random_codes(20, codec_decoder.config.codebook_size, seed=40 + p) for p in requests}
    stand_ins = {p: StandInDecode(bus, request_id) for p, request_id in requests.items()}
    listeners = {p: await Listener.open(bus.nc, request_id) for p, request_id in requests.items()}
    async with running_vocoder(bus, codec_model_dir, replica="vocoder-a"):
        for p, stand_in in stand_ins.items():
            await stand_in.start()
            await stand_in.chunks(codes[p][:10], [2, 8])
            await listeners[p].audio_chunks(2)
        # One request in each partition: the least busy is a tie, so the highest partition is handed over.
        async with running_vocoder(bus, codec_model_dir, replica="vocoder-b", owns=[NUM_PARTITIONS - 1]):
            for p, stand_in in stand_ins.items():
                await stand_in.chunks(codes[p][10:], [8, 2])
                await stand_in.finish()
            terminals = {p: await listener.terminal() for p, listener in listeners.items()}
            a, b = await status(bus, "vocoder-a"), await status(bus, "vocoder-b")

    assert (a["partitions"], b["partitions"]) == (list(range(NUM_PARTITIONS - 1)), [NUM_PARTITIONS - 1])
    assert a["partitions_handed_off"] == 1
    for p, terminal in terminals.items():
        assert isinstance(terminal, Finished) and (terminal.chunk_count, terminal.frames) == (4, 20)
        expected = full_decode_pcm(codec_decoder, codes[p]).astype(np.int32)
        assert_voiced_exactly(listeners[p].audio, expected, 4)
        assert len(await stored_terminals(bus.js, requests[p])) == 1


async def test_a_live_vocoder_that_never_claims_its_share_leaves_no_partition_unserved(bus, codec_model_dir):
    idle = LeaseKeeper(bus.kv, "vocoder-idle", "vocoder", interval_s=1.0, ttl_s=WAIT_S)
    await idle.renew()  # live for the whole test, and it never claims a partition
    async with running_vocoder(bus, codec_model_dir, replica="vocoder-busy"):  # waits until it owns them all
        stats = await status(bus, "vocoder-busy")
    assert stats["partitions"] == list(range(NUM_PARTITIONS))
