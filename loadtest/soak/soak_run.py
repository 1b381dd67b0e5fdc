"""One soak: `voxmesh up` (the tiny model unless the up flags name another, a fresh state directory, a free port), a
warm-up under `voxmesh bench`, a sample of every process, of the GPU and of the bus at a quiet moment, `voxmesh bench`
for the soak's duration (each first packet broken into stages from the mesh's events), a second sample at a quiet
moment, the mesh stopped as Ctrl-C would, then the verdicts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.soak.bench_argv import bench_argv, picks_length
from loadtest.soak.bus_samples import quiet, sample_bus
from loadtest.soak.config import SoakConfig
from loadtest.soak.flatness import Moment, consumer_verdicts, gpu_verdict, is_flat, process_verdicts, stream_verdicts
from loadtest.soak.gpu_samples import sample_gpu
from loadtest.soak.latency_flatness import latency_verdict
from loadtest.soak.process_samples import mesh_processes, sample_process

REPO = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"voxmesh is serving: (\S+)\s+\(NATS (\S+),")
CUT_OFF = "client_timeout"  # the bench's code for a request its deadline ended
QUIET_TIMEOUT_S = 300.0  # a request the bench cut off at its deadline waits out the resume window (30 s) first
STOP_TIMEOUT_S = 120.0
OBSERVER = "observer"  # the read-only user `voxmesh up` makes: enough for the bench to read EVENTS back
# Inherited credentials the bench's events reader would prefer to the observer's: this mesh knows only its own users.
INHERITED_CREDENTIALS = ("VOXMESH_NATS_PASSWORD", "VOXMESH_NATS_TOKEN", "VOXMESH_NATS_CREDS_FILE")


@dataclass
class RunningMesh:
    """A started mesh: its `voxmesh up` process, its gateway, its NATS with the operator's credentials (the soak's
    bus samples), its NATS as printed (the bench's events reader, as the observer) and its state directory."""

    process: asyncio.subprocess.Process
    gateway_url: str
    nats_url: str
    events_url: str
    state_dir: Path


async def soak(config: SoakConfig, command: str) -> dict:
    """Run the soak; the document that `flatness.markdown` renders."""
    work = config.work_dir
    async with running_mesh(work / "state", work / "mesh.log", config) as mesh:
        warmup = await bench(mesh, config, config.warmup_s, work / "bench-warmup.json")
        start = await quiet_moment(mesh)
        document = await bench(mesh, config, config.duration_s, work / "bench.json", with_stages=True)
        end = await quiet_moment(mesh)
    return report(config, command, document, start, end, warmup)


def report(config: SoakConfig, command: str, bench_document: dict, start: Moment, end: Moment,
           warmup_document: dict | None = None) -> dict:
    level = bench_document["targets"][0]["levels"][0]
    summary = level["summary"]
    meta = bench_document["meta"]
    errors = dict(summary["errors"])
    cut_off = errors.pop(CUT_OFF, 0)  # the requests in flight when the level's time ran out: the bench's, not ours
    warmup_failed = 0 if warmup_document is None else _failed(warmup_document["targets"][0]["levels"][0]["summary"])
    run = {"command": command, "date": meta["date"], "commit": (meta.get("commit") or "?")[:12],
           "dirty": meta.get("dirty"), "machine": _machine(meta.get("machine", {})),
           "duration_s": config.duration_s, "warmup_s": config.warmup_s, "load": config.describe_load(),
           "mode": "open" if config.is_open_loop else "closed", "rate": config.rate,
           "concurrency": None if config.is_open_loop else config.concurrency,
           "fixed_frames": None if picks_length(config.bench_args) else config.fixed_frames,
           "up_args": shlex.join(config.up_args), "bench_args": shlex.join(config.bench_args),
           "requests_completed": summary["num_completed"], "requests_failed": summary["num_failed"] - cut_off,
           "requests_cut_off": cut_off, "warmup_requests_failed": warmup_failed, "errors": errors,
           "requests_per_s": summary["requests_per_s"], "audio_s_per_s": summary["audio_s_per_s"],
           "work_dir": str(config.work_dir)}
    processes = process_verdicts(start, end)
    streams = stream_verdicts(start, end, summary["num_completed"] + summary["num_failed"])
    consumers = consumer_verdicts(end)
    latency = latency_verdict(level["requests"], config.duration_s, config.window_s)
    gpu = gpu_verdict(start, end)
    flat = is_flat(processes, streams, consumers, requests_failed=run["requests_failed"] + warmup_failed,
                   latency=latency, gpu=gpu)
    return {"run": run, "flat": flat, "processes": processes, "streams": streams, "consumers": consumers,
            "gpu": gpu, "latency": latency, "start": start.to_dict(), "end": end.to_dict()}


def _failed(summary: dict) -> int:
    """Failed requests of a level, less the ones the bench cut off at its deadline."""
    return summary["num_failed"] - summary["errors"].get(CUT_OFF, 0)


async def quiet_moment(mesh: RunningMesh) -> Moment:
    """The processes and the GPU, sampled while nothing is in flight (and the quiet check's own two connections are
    open), then the bus."""
    async with quiet(mesh.gateway_url, mesh.nats_url, QUIET_TIMEOUT_S) as held:
        pids = mesh_processes(mesh.process.pid)
        processes = {name: sample_process(name, pid) for name, pid in pids.items()}
        gpu = await sample_gpu(pids)
    return Moment(processes, await sample_bus(mesh.nats_url), held, gpu)


def _as_operator(nats_url: str, state_dir: Path) -> str:
    """The URL with the operator's user and password (`voxmesh up` refuses strangers); sampled here, never logged."""
    password = (state_dir / "nats-auth" / "operator.password").read_text(encoding="utf-8").strip()
    return nats_url.replace("nats://", f"nats://operator:{password}@", 1)


@contextlib.asynccontextmanager
async def running_mesh(state_dir: Path, log_path: Path, config: SoakConfig) -> AsyncIterator[RunningMesh]:
    """`voxmesh up` with the soak's up flags on a free port with its own state directory (its first run writes the
    tiny checkpoint); its output goes to `log_path`. Stopped with SIGINT, as Ctrl-C would."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "up", "--port", str(port), "--state-dir", str(state_dir),
        *config.up_args, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    serving: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
    copier = asyncio.create_task(_copy_log(process, log_path, serving))
    try:
        gateway_url, nats_url = await asyncio.wait_for(asyncio.shield(serving), config.start_timeout_s)
        yield RunningMesh(process, gateway_url, _as_operator(nats_url, state_dir), nats_url, state_dir)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        await copier


async def _copy_log(process: asyncio.subprocess.Process, log_path: Path,
                    serving: asyncio.Future[tuple[str, str]]) -> None:
    """The mesh's output into its log file; `serving` gets the URLs from the line `voxmesh up` prints when ready."""
    with log_path.open("w") as log:
        async for raw in process.stdout:
            line = raw.decode(errors="replace")
            log.write(line)
            if not serving.done() and (match := SERVING.search(line)):
                serving.set_result((match.group(1), match.group(2)))
    if not serving.done():
        serving.set_exception(RuntimeError(f"voxmesh up ended before serving; see {log_path}"))


async def bench(mesh: RunningMesh, config: SoakConfig, seconds: float, out: Path, *,
                with_stages: bool = False) -> dict:
    """`voxmesh bench`, one level bounded by `seconds` (bench_argv.py); `with_stages`: it reads the mesh's events
    back as the observer (its password from a file, never on a command line) and breaks each first packet into
    stages."""
    argv = bench_argv(config, mesh.gateway_url, seconds, out, mesh.events_url if with_stages else None)
    env = {key: value for key, value in os.environ.items() if key not in INHERITED_CREDENTIALS}
    if with_stages:
        env |= {"VOXMESH_NATS_USER": OBSERVER,
                "VOXMESH_NATS_PASSWORD_FILE": str(mesh.state_dir / "nats-auth" / f"{OBSERVER}.password")}
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.cli", *argv, cwd=REPO, env=env,
                                                   stdout=asyncio.subprocess.DEVNULL)
    if await process.wait() != 0:
        raise RuntimeError(f"voxmesh {shlex.join(argv)} failed with code {process.returncode}")
    return json.loads(out.read_text())


def _machine(machine: dict) -> str:
    return f"{machine.get('cpu_count', '?')} CPUs ({machine.get('platform', 'unknown platform')})"
