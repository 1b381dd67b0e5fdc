"""One soak: `voxmesh up` (the tiny model, a fresh state directory, a free port), a warm-up under `voxmesh bench`,
a sample of every process and of the bus at a quiet moment, `voxmesh bench` for the soak's duration, a second
sample at a quiet moment, the mesh stopped as Ctrl-C would, then the verdicts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.soak.bus_samples import quiet, sample_bus
from loadtest.soak.flatness import Moment, consumer_verdicts, is_flat, process_verdicts, stream_verdicts
from loadtest.soak.process_samples import mesh_processes, sample_process

REPO = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"voxmesh is serving: (\S+)\s+\(NATS (\S+),")
START_TIMEOUT_S = 300.0
CUT_OFF = "client_timeout"  # the bench's code for a request its deadline ended
QUIET_TIMEOUT_S = 300.0  # a request the bench cut off at its deadline waits out the resume window (30 s) first
STOP_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """What the soak runs.

    Attributes:
        duration_s: seconds of load between the two samples.
        warmup_s: seconds of load before the first sample (allocators and caches settle).
        concurrency: closed-loop clients of `voxmesh bench`.
        fixed_frames: frames per request (the tiny model's random weights rarely end on their own).
        work_dir: the mesh's state, its log and the bench's own JSON (every request), kept for a look afterwards.
    """

    duration_s: float
    warmup_s: float
    concurrency: int
    fixed_frames: int
    work_dir: Path


@dataclass
class RunningMesh:
    process: asyncio.subprocess.Process
    gateway_url: str
    nats_url: str


async def soak(config: SoakConfig, command: str) -> dict:
    """Run the soak; the document that `flatness.markdown` renders."""
    work = config.work_dir
    async with running_mesh(work / "state", work / "mesh.log") as mesh:
        await bench(mesh, config, config.warmup_s, work / "bench-warmup.json")
        start = await quiet_moment(mesh)
        document = await bench(mesh, config, config.duration_s, work / "bench.json")
        end = await quiet_moment(mesh)
    return report(config, command, document, start, end)


def report(config: SoakConfig, command: str, bench_document: dict, start: Moment, end: Moment) -> dict:
    summary = bench_document["targets"][0]["levels"][0]["summary"]
    meta = bench_document["meta"]
    errors = dict(summary["errors"])
    cut_off = errors.pop(CUT_OFF, 0)  # the requests in flight when the level's time ran out: the bench's, not ours
    run = {"command": command, "date": meta["date"], "commit": (meta.get("commit") or "?")[:12],
           "dirty": meta.get("dirty"), "machine": _machine(meta.get("machine", {})),
           "duration_s": config.duration_s, "warmup_s": config.warmup_s, "concurrency": config.concurrency,
           "fixed_frames": config.fixed_frames, "requests_completed": summary["num_completed"],
           "requests_failed": summary["num_failed"] - cut_off, "requests_cut_off": cut_off, "errors": errors,
           "requests_per_s": summary["requests_per_s"], "audio_s_per_s": summary["audio_s_per_s"],
           "work_dir": str(config.work_dir)}
    processes = process_verdicts(start, end)
    streams = stream_verdicts(start, end, summary["num_completed"] + summary["num_failed"])
    consumers = consumer_verdicts(end)
    return {"run": run, "flat": is_flat(processes, streams, consumers), "processes": processes,
            "streams": streams, "consumers": consumers, "start": start.to_dict(), "end": end.to_dict()}


async def quiet_moment(mesh: RunningMesh) -> Moment:
    """The processes, sampled while nothing is in flight (and the quiet check's own two connections are open), then
    the bus."""
    async with quiet(mesh.gateway_url, mesh.nats_url, QUIET_TIMEOUT_S) as held:
        processes = {name: sample_process(name, pid) for name, pid in mesh_processes(mesh.process.pid).items()}
    return Moment(processes, await sample_bus(mesh.nats_url), held)


def _as_operator(nats_url: str, state_dir: Path) -> str:
    """The URL with the operator's user and password (`voxmesh up` refuses strangers); sampled here, never logged."""
    password = (state_dir / "nats-auth" / "operator.password").read_text(encoding="utf-8").strip()
    return nats_url.replace("nats://", f"nats://operator:{password}@", 1)


@contextlib.asynccontextmanager
async def running_mesh(state_dir: Path, log_path: Path) -> AsyncIterator[RunningMesh]:
    """`voxmesh up` on a free port with its own state directory (its first run writes the tiny checkpoint); its
    output goes to `log_path`. Stopped with SIGINT, as Ctrl-C would."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "up", "--port", str(port), "--state-dir", str(state_dir), cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    serving: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
    copier = asyncio.create_task(_copy_log(process, log_path, serving))
    try:
        gateway_url, nats_url = await asyncio.wait_for(asyncio.shield(serving), START_TIMEOUT_S)
        yield RunningMesh(process, gateway_url, _as_operator(nats_url, state_dir))
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


async def bench(mesh: RunningMesh, config: SoakConfig, seconds: float, out: Path) -> dict:
    """`voxmesh bench`, one closed-loop level bounded by `seconds` (and by a request count it cannot reach)."""
    argv = ["bench", "--url", mesh.gateway_url, "--mode", "closed", "--concurrency", str(config.concurrency),
            "--requests", "1000000", "--level-timeout", str(seconds), "--fixed-frames", str(config.fixed_frames),
            "--warmup", "0", "--no-plot", "--out", str(out)]
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.cli", *argv, cwd=REPO,
                                                   stdout=asyncio.subprocess.DEVNULL)
    if await process.wait() != 0:
        raise RuntimeError(f"voxmesh {shlex.join(argv)} failed with code {process.returncode}")
    return json.loads(out.read_text())


def _machine(machine: dict) -> str:
    return f"{machine.get('cpu_count', '?')} CPUs ({machine.get('platform', 'unknown platform')})"
