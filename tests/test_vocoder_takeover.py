"""Vocoder partition takeover: a vocoder process is killed mid-request; a standby claims its partitions once its lease
lapses, rebuilds the request's codec state from CODES, and the request's audio continues exactly."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

from messages.events import Finished
from services.bus.claims import read_partition
from tests.test_vocoder_support import (
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
