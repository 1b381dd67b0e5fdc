"""What the mtp tests share: replica processes (`python -m services.mtp`) on a provisioned bus, a client on the test's
event loop, step rows with mixed sampling, the codes `predict_rest` gives for them locally, and replicas' STATS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import torch

from messages import subjects
from messages.streams import BusConfig
from services.bus.connection import connect
from services.bus.provision import open_bucket
from services.engine.model_ops import predict_rest
from services.model.loader import TTSModel, load_model
from services.model.sampling import RowSampling, SamplingParams
from tests.support.mesh_client import replica_stats as mesh_replica_stats
from services.mtp.client import RemotePredictor
from services.mtp.service import SERVICE_NAME
from tests.support.nats_server import fresh_bus

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 120.0  # bound on any one wait for processes to start
STEP_S = 30.0  # a step's timeout where no test wants one to pass


async def provision_bus(url: str) -> None:
    nc = await connect(url, "voxmesh-mtp-test-provision", initial_timeout_s=10.0)
    try:
        await fresh_bus(nc.jetstream(), BusConfig(storage="memory"))
    finally:
        await nc.close()


def start_replica(url: str, model_dir: Path, replica: str, *, lease_ttl_s: float = 3.0,
                  via_cli: bool = False) -> subprocess.Popen:
    """One replica, `python -m services.mtp` (or `voxmesh serve mtp`), configured through the environment."""
    env = dict(os.environ, VOXMESH_NATS_URL=url, VOXMESH_MODEL_DIR=str(model_dir), VOXMESH_REPLICA=replica,
               VOXMESH_LEASE_TTL_S=str(lease_ttl_s), VOXMESH_TICK_S=str(lease_ttl_s / 5),
               VOXMESH_LOG_LEVEL="WARNING", OMP_NUM_THREADS="1")
    command = ["-m", "services.cli", "serve", "mtp"] if via_cli else ["-m", "services.mtp"]
    return subprocess.Popen([sys.executable, *command], cwd=REPO, env=env, stdin=subprocess.DEVNULL)


def stop_replica(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)  # a paused one must run to take its SIGTERM
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def replicas(url: str, model_dir: Path, *names: str, lease_ttl_s: float = 3.0,
             via_cli: tuple[str, ...] = ()) -> Iterator[dict[str, subprocess.Popen]]:
    """Replica processes by name (those in `via_cli` started as `voxmesh serve mtp`); stopped on exit."""
    started = {name: start_replica(url, model_dir, name, lease_ttl_s=lease_ttl_s, via_cli=name in via_cli)
               for name in names}
    try:
        yield started
    finally:
        for process in started.values():
            stop_replica(process)


def kill(process: subprocess.Popen) -> None:
    """SIGKILL, and reap it: no drain, no lease release."""
    process.kill()
    process.wait()


@contextlib.asynccontextmanager
async def predictor_client(url: str, fingerprint: str, *, timeout_s: float, attempts: int,
                           count: int = 2) -> AsyncIterator[RemotePredictor]:
    """A RemotePredictor on this loop, once `count` replicas are live."""
    nc = await connect(url, "voxmesh-mtp-test-decode", initial_timeout_s=10.0)
    client = RemotePredictor(nc, asyncio.get_running_loop(), fingerprint, timeout_s=timeout_s, attempts=attempts)
    try:
        await client.wait_for_replicas(count, WAIT_S)
        yield client
    finally:
        await client.close()
        await nc.close()


@dataclass(frozen=True)
class Rows:
    """One step's rows: what the engine hands the predictor."""

    hidden: torch.Tensor
    c0: torch.Tensor
    seeds: list[int]
    frames: list[int]
    params: list[SamplingParams]

    def args(self) -> tuple:
        return self.hidden, self.c0, self.seeds, self.frames, self.params


GREEDY = SamplingParams(temperature=0.0)
MIXED = [SamplingParams(temperature=0.9, top_k=50, top_p=1.0), GREEDY, SamplingParams(temperature=1.3, top_k=0,
         top_p=0.8), SamplingParams(temperature=0.7, top_k=5, top_p=0.95), SamplingParams(temperature=1.0, top_k=2)]


def make_rows(model: TTSModel, num_rows: int, *, seed: int, sampled: bool) -> Rows:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_rows, model.config.talker.decoder.hidden_size, generator=generator) * 3
    c0 = torch.randint(0, model.config.talker.code_predictor.vocab_size, (num_rows,), generator=generator)
    params = [MIXED[i % len(MIXED)] if sampled else GREEDY for i in range(num_rows)]
    return Rows(hidden, c0, [1000 + 7 * i + seed for i in range(num_rows)], [3 * i for i in range(num_rows)], params)


def local_codes(model: TTSModel, rows: Rows) -> torch.Tensor:
    """What decode's own code predictor computes for the rows."""
    with torch.inference_mode():
        return predict_rest(model, rows.hidden, rows.c0, RowSampling.build(rows.params, rows.seeds, rows.frames))


def load_local(model_dir: Path) -> TTSModel:
    return load_model(model_dir, dtype=torch.float32, device="cpu")


async def until(url: str, condition: Callable[[], bool]) -> None:
    """Return once `condition()` holds, checked again at each lease renewal in the bus (the replicas renew several
    times a second), bounded by WAIT_S."""
    nc = await nats.connect(url)
    watcher = await (await open_bucket(nc.jetstream())).watch(subjects.all_lease_keys())
    try:
        async with asyncio.timeout(WAIT_S):
            while not condition():
                await watcher.updates(timeout=WAIT_S)
    finally:
        await watcher.stop()
        await nc.close()


async def replica_stats(url: str, count: int) -> dict[str, dict]:
    """Each of `count` mtp replicas' STATS `data`, by replica name."""
    return await mesh_replica_stats(url, SERVICE_NAME, count)
