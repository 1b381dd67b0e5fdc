"""First packet through `voxmesh up` with one server (R1) and with `--nats-cluster 3` (R3), in one run, on the tiny
model: both meshes up at once, `voxmesh bench --compare-url` alternating closed-loop levels between them (so each
level of one mesh runs beside the same machine load as the other's), and on each mesh's bus a subscriber to `>`
counting messages and bytes per subject (`subject_census`), the servers' CPU seconds, and their bytes in, out and
on routes (monitoring /varz, /routez).

`python -m loadtest.bus.replication_bench --out F.json [--concurrency 2 --levels 3 --level-seconds 30]`
(loopback only; bounded by the levels' time and request bounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from loadtest.bus.latency import ratios, summary
from loadtest.bus.machine import stamp
from loadtest.bus.mesh_process import MeshProcess
from loadtest.bus.subject_census import Census
from services.bus.connection import connect
from services.bus.embedded_cluster import free_port

CLOCK_TICKS = 100


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def _bytes(monitor_urls: list[str]) -> dict[str, int]:
    found = {"in_bytes": 0, "out_bytes": 0, "route_out_bytes": 0}
    for url in monitor_urls:
        if not url.startswith("http://127.0.0.1:"):
            continue
        with urllib.request.urlopen(f"{url}/varz", timeout=5) as answer:
            varz = json.load(answer)
        found["in_bytes"] += varz.get("in_bytes", 0)
        found["out_bytes"] += varz.get("out_bytes", 0)
        with urllib.request.urlopen(f"{url}/routez", timeout=5) as answer:
            found["route_out_bytes"] += sum(r.get("out_bytes", 0) for r in json.load(answer).get("routes") or [])
    return found


def _bench_command(meshes: list[MeshProcess], args: argparse.Namespace, out: Path) -> list[str]:
    r1, r3 = meshes
    return [sys.executable, "-m", "services.cli", "bench", "--url", r1.gateway_url, "--label", r1.label,
            "--compare-url", r3.gateway_url, "--compare-label", r3.label,
            "--events-url", r1.operator_url(), "--compare-events-url", r3.operator_url(),
            "--mode", "closed", "--concurrency", *[str(args.concurrency)] * args.levels,
            "--requests", str(args.requests), "--level-timeout", str(args.level_seconds),
            "--fixed-frames", str(args.fixed_frames), "--warmup", "2", "--no-plot", "--out", str(out),
            *(["--prompts", str(args.prompts)] if args.prompts is not None else [])]


def first_packets(bench: dict) -> dict:
    """Every measured request's first packet (ms) pooled over the levels, per target, and R3/R1."""
    pooled = {}
    for target in bench["targets"]:
        values = [request["first_packet_s"] * 1000.0 for level in target["levels"] for request in level["requests"]
                  if request.get("first_packet_s") is not None and request.get("ok", True)]
        pooled[target["label"]] = summary(values)
    found = {"first_packet_ms": pooled}
    if "R1" in pooled and "R3" in pooled:
        found["ratio_r3_over_r1"] = ratios(pooled["R3"], pooled["R1"])
    return found


def stages(bench: dict) -> dict:
    """Per target and level, each first-packet stage's median and p95 (ms), from the mesh's lifecycle events."""
    found = {}
    for target in bench["targets"]:
        rows = []
        for level in target["levels"]:
            read = level.get("first_packet_stages") or {}
            rows.append({name: {"p50": round(v["median"] * 1000.0, 1), "p95": round(v["p95"] * 1000.0, 1)}
                         for name, v in read.items() if isinstance(v, dict) and "median" in v})
        found[target["label"]] = rows
    return found


async def _measured_bench(meshes: list[MeshProcess], args: argparse.Namespace, bench_out: Path) -> dict:
    clients = [await connect(mesh.nats_urls, f"census-{mesh.label}", user="operator",
                             password=mesh.operator_password) for mesh in meshes]
    censuses = [Census() for _ in meshes]
    pids = [mesh.server_pids() for mesh in meshes]
    try:
        for census, nc in zip(censuses, clients):
            await census.start(nc)
        cpu_before = [_cpu_seconds(p) for p in pids]
        bytes_before = [_bytes(mesh.monitor_urls) for mesh in meshes]
        began = time.monotonic()
        bench = await asyncio.create_subprocess_exec(*_bench_command(meshes, args, bench_out))
        if await bench.wait() != 0:
            raise RuntimeError(f"voxmesh bench exited with {bench.returncode}")
        seconds = time.monotonic() - began
        cpu_after = [_cpu_seconds(p) for p in pids]
        bytes_after = [_bytes(mesh.monitor_urls) for mesh in meshes]
        for nc in clients:
            await nc.flush()
    finally:
        for census in censuses:
            await census.stop()
        for nc in clients:
            await nc.close()
    buses = {}
    for i, mesh in enumerate(meshes):
        requests = max(censuses[i].requests, 1)
        moved = {key: bytes_after[i][key] - bytes_before[i][key] for key in bytes_before[i]}
        buses[mesh.label] = {
            "servers": len(pids[i]), "census": censuses[i].report(seconds),
            "server_cpu_s": round(cpu_after[i] - cpu_before[i], 2),
            "server_cpu_ms_per_request": round((cpu_after[i] - cpu_before[i]) * 1000.0 / requests, 1),
            "server_bytes": moved, "server_bytes_per_request": {k: round(v / requests) for k, v in moved.items()}}
    return buses


def _checkpoint(directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "services.cli", "model", "init", "--preset", "tiny", "--out",
                    str(directory)], check=True, capture_output=True, timeout=600)
    return directory


def run(args: argparse.Namespace) -> dict:
    head = stamp()
    with tempfile.TemporaryDirectory(prefix="voxmesh-replication-") as temp:
        root = Path(temp)
        model = args.model or _checkpoint(root / "tiny")
        meshes = [MeshProcess("R1", root / "state-r1", model, free_port()),
                  MeshProcess("R3", root / "state-r3", model, free_port(), ("--nats-cluster", "3"))]
        try:
            for mesh in meshes:
                mesh.start()
            bench_out = args.out.with_name(args.out.stem + "_bench.json")
            buses = asyncio.run(_measured_bench(meshes, args, bench_out))
        finally:
            codes = {mesh.label: mesh.stop() for mesh in meshes}
    bench = json.loads(bench_out.read_text())
    return {"tool": "replication_bench", **head, "bench_file": bench_out.name,
            "load": {"mode": "closed", "concurrency": args.concurrency, "levels": args.levels,
                     "level_seconds": args.level_seconds, "requests_per_level": args.requests,
                     "fixed_frames": args.fixed_frames},
            **first_packets(bench), "first_packet_stages": stages(bench), "bench_comparison": bench.get("comparison"), "buses": buses,
            "mesh_exit_codes": codes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="tiny checkpoint dir (default: one written for the run)")
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop streams (default 2)")
    parser.add_argument("--levels", type=int, default=3, help="levels per mesh, alternating (default 3)")
    parser.add_argument("--level-seconds", type=float, default=30.0, help="time bound of one level (default 30)")
    parser.add_argument("--requests", type=int, default=40, help="request bound of one level (default 40)")
    parser.add_argument("--fixed-frames", type=int, default=24, help="frames per request (default 24)")
    parser.add_argument("--prompts", type=Path, help="voxmesh bench's --prompts (default: its own default)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    document = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps({"first_packet_ms": document["first_packet_ms"],
                      "ratio_r3_over_r1": document.get("ratio_r3_over_r1")}, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
