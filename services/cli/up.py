"""`voxmesh up`: the whole mesh on this machine, from a topology's compose file.

Starts an embedded nats-server (JetStream, loopback, store under the state dir, HTTP
monitoring on a free loopback port), or with --nats-cluster N a JetStream cluster of N, unless --nats-url is given,
writes the tiny checkpoint on first run if no --model is given (a hub id: taken from the hub's cache, or downloaded
into it first), runs the compose file's one-shot steps (provisioning), starts its services as local processes,
waits until the gateway is ready, prints the URLs, and on Ctrl-C or SIGTERM drains and
stops everything.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Mapping

import httpx

from services.bus.nats_auth import NatsAuth
from services.mesh.gpu_placement import PlacementError, parse_placements, replica_environment
from services.mesh.compose_plan import ComposeError, LaunchPlan, ServicePlan, container_only_removed, load_plan
from services.mesh.cuda_mps import CudaMps, CudaMpsError
from services.mesh.resume_secret import ensure_resume_secret
from services.mesh.roles import nats_user_of, role_of
from services.mesh.processes import ProcessGroup, child_environment
from services.mesh.state_lock import StateDirInUse, StateLock
from services.mesh.tls_dir import TlsDir, TlsDirError
from services.mesh.up_model import ModelChoice, choose_model
from services.runtime.settings_schema import SettingsError
from services.vocoder.stream_limit import streams_for_decode

log = logging.getLogger("voxmesh.up")

READY_TIMEOUT_S = 180.0


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "voxmesh"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", default="single", help="compose/<NAME>.yml to run (default: single)")
    parser.add_argument("--model", default=None,
                        help="checkpoint dir, or a Hugging Face hub id ORG/NAME (taken from the hub's cache, downloaded "
                             "into it when missing); default: a tiny random checkpoint made in the state dir on first "
                             "run")
    parser.add_argument("--revision", default=None,
                        help="with a hub id: the branch, tag or commit to serve (default: VOXMESH_REVISION, else main)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port on 127.0.0.1 (default 8000)")
    parser.add_argument("--nats-url", default=None,
                        help="use this NATS server (or cluster: its URLs, comma-separated) instead of an embedded one")
    parser.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                        help="run N embedded nats-servers as one JetStream cluster on loopback (routes, a store "
                             "each, the same users, TLS and store encryption) and provision every stream with "
                             "min(N, 5) replicas; default 1 (one server)")
    parser.add_argument("--encrypt-store", action=argparse.BooleanOptionalAction, default=True,
                        help="encrypt the embedded server's JetStream store at rest, under a key kept in the state "
                             "dir (nats-store.key); on by default")
    parser.add_argument("--tls-dir", type=Path, default=None,
                        help="TLS for the gateway (HTTPS) and NATS, from DIR/ca.pem, server.pem, server-key.pem "
                             "(and client.pem, client-key.pem: the server then verifies its clients)")
    parser.add_argument("--state-dir", type=Path, default=None, help=f"default: {default_state_dir()}")
    parser.add_argument("--model-name", default=None,
                        help="the name clients ask for (default: VOXMESH_MODEL_NAME, else the hub id or the checkpoint "
                             "folder's name: `tiny` for the first-run checkpoint)")
    parser.add_argument("--device", default=None, help="torch device for decode and vocoder (default: the file's)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
    parser.add_argument("--kv-cache-blocks", type=int, default=None, help="decode's KV pool size in blocks")
    parser.add_argument("--gpu-memory-fraction", type=float, default=None,
                        help="decode's share of the card's total memory (weights, KV pool, graphs); "
                             "replaces --kv-cache-blocks on CUDA")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="decode's concurrent sequence limit (above 64 the vocoder's --max-streams follows it, "
                             "unless VOXMESH_MAX_STREAMS is set)")
    parser.add_argument("--recompute-preemption", choices=("allow", "fail"), default=None,
                        help="what decode does with a preempted request (DESIGN.md)")
    parser.add_argument("--gpus", action="append", default=[], metavar="SERVICE=I[,J...]",
                        help="on a host with several GPUs: the GPU each replica of SERVICE sees (replica k the k-th "
                             "index), e.g. --gpus prefill=1 --gpus decode=0; repeatable; unnamed services see all")
    parser.add_argument("--cuda-mps", action="store_true",
                        help="with --device cuda: run a CUDA MPS control daemon of the mesh's own (pipe and log folders "
                             "under the state dir) and make every service its client, so the processes sharing a card "
                             "run their kernels side by side instead of taking turns; needs nvidia-cuda-mps-control")


def _overrides(args: argparse.Namespace, nats_url: str, model: ModelChoice, stream_replicas: int | None,
               environ: Mapping[str, str]) -> dict[str, str]:
    """What `up` tells every service beyond the compose file (`environ`: its own environment, which the children
    inherit underneath)."""
    values = {
        "VOXMESH_NATS_URL": nats_url,
        "VOXMESH_STREAM_REPLICAS": stream_replicas,  # read by the provisioning step only
        **model.environment(),
        "VOXMESH_HOST": "127.0.0.1",
        "VOXMESH_PORT": str(args.port),
        "VOXMESH_DEVICE": args.device,
        "VOXMESH_DTYPE": args.dtype,
        "VOXMESH_KV_CACHE_BLOCKS": args.kv_cache_blocks,
        "VOXMESH_GPU_MEMORY_FRACTION": args.gpu_memory_fraction,
        "VOXMESH_MAX_NUM_SEQS": args.max_num_seqs,
        # The vocoder voices every request decode runs, unless the user set its limit.
        "VOXMESH_MAX_STREAMS": (None if "VOXMESH_MAX_STREAMS" in environ
                                else streams_for_decode(args.max_num_seqs)),
        "VOXMESH_RECOMPUTE_PREEMPTION": args.recompute_preemption,
    }
    return {key: str(value) for key, value in values.items() if value is not None}


def _server_config(state_dir: Path, auth: NatsAuth, encrypt_store: bool, tls: TlsDir | None) -> Path:
    """The embedded server's configuration: its users, its store encrypted under the state dir's key (unless told
    not to), and TLS when given."""
    from services.bus.server_config import server_config, write_server_config
    from services.bus.store_key import ensure_store_key

    key = ensure_store_key(state_dir / "nats-store.key") if encrypt_store else None
    text = server_config(store_key=key, tls=tls.server() if tls is not None else None)
    return write_server_config(auth.directory / "server.conf", text)


def _environment(plan: ServicePlan, overrides: dict[str, str], auth: NatsAuth | None, resume_secret: Path,
                 tls: TlsDir | None) -> dict[str, str]:
    """A child's environment; with the embedded server, its own NATS user and the file holding its password; a
    gateway's, the file of the resume tokens' secret (every gateway the same); with TLS, the CA (and the gateway's
    certificate)."""
    is_gateway = role_of(plan.command) == "gateway"
    env = child_environment(container_only_removed(plan.environment), overrides)
    if tls is not None:
        env.update(tls.environment(gateway=is_gateway))
    if is_gateway and "VOXMESH_RESUME_SECRET" not in env:
        env.setdefault("VOXMESH_RESUME_SECRET_FILE", str(resume_secret))
    if auth is not None:
        user = nats_user_of(plan.command)
        for inherited in ("VOXMESH_NATS_PASSWORD", "VOXMESH_NATS_TOKEN", "VOXMESH_NATS_CREDS_FILE"):
            env.pop(inherited, None)  # this mesh's server knows only its own users
        env["VOXMESH_NATS_USER"] = user
        env["VOXMESH_NATS_PASSWORD_FILE"] = str(auth.password_file(user))
    return env


def _wait_ready(url: str, group: ProcessGroup, stop: threading.Event, tls: TlsDir | None) -> bool:
    """Probe the gateway's /ready until it answers 200, a child dies, or we are told to stop."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    verify = ssl.create_default_context(cafile=str(tls.ca_file)) if tls is not None else True
    with httpx.Client(timeout=2.0, verify=verify) as client:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                if client.get(f"{url}/ready").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            stop.wait(0.25)  # a readiness probe's interval; wakes at once on a signal or a dead child
    return False


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        plan = load_plan(args.topology)
        args.placements = parse_placements(args.gpus, [service.name for service in plan.services])
    except (ComposeError, PlacementError) as error:
        print(f"voxmesh up: {error}", file=sys.stderr)
        return 2
    if args.cuda_mps and not (args.device or "").startswith("cuda"):
        print("voxmesh up: --cuda-mps shares a CUDA card between the mesh's processes: give --device cuda too",
              file=sys.stderr)
        return 2
    if args.nats_cluster < 1 or (args.nats_cluster > 1 and args.nats_url is not None):
        print("voxmesh up: --nats-cluster N needs N >= 1, and no --nats-url (it runs its own servers)", file=sys.stderr)
        return 2
    try:
        tls = TlsDir.open(args.tls_dir) if args.tls_dir is not None else None
    except TlsDirError as error:
        print(f"voxmesh up: {error}", file=sys.stderr)
        return 2
    state_dir = (args.state_dir or default_state_dir()).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    try:  # before anything starts: a second mesh on this store would only meet the first as NATS timeouts
        lock = StateLock.acquire(state_dir, owner=f"gateway http://127.0.0.1:{args.port}")
    except StateDirInUse as error:
        print(f"voxmesh up: {error}", file=sys.stderr)
        return 1
    try:
        return _run_locked(args, plan, state_dir, tls)
    finally:
        lock.release()


def _run_locked(args: argparse.Namespace, plan: LaunchPlan, state_dir: Path, tls: TlsDir | None) -> int:
    try:  # before the bus starts (a model that cannot be had has nothing to stop) and before the signals are taken
        # over: a download takes its time, and Ctrl-C stops it
        model = choose_model(args.model, args.revision, args.model_name, state_dir, os.environ)
    except SettingsError as error:
        print(f"voxmesh up: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("voxmesh up: interrupted before anything started", file=sys.stderr)
        return 130
    try:
        mps = CudaMps.start(state_dir) if args.cuda_mps else None
    except CudaMpsError as error:
        print(f"voxmesh up: {error}", file=sys.stderr)
        return 1
    try:
        return _run_bus_and_services(args, plan, state_dir, tls, model, mps)
    finally:
        if mps is not None:
            mps.stop()


def _run_bus_and_services(args: argparse.Namespace, plan: LaunchPlan, state_dir: Path, tls: TlsDir | None,
                          model: ModelChoice, mps: CudaMps | None) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    embedded, auth = None, None
    if args.nats_url is None:
        from services.bus.nats_auth import write_auth
        from services.mesh.embedded_bus import start_cluster, start_single

        auth = write_auth(state_dir / "nats-auth")  # fresh passwords each start; the old ones stop working
        config = _server_config(state_dir, auth, args.encrypt_store, tls)
        embedded = (start_single(state_dir, auth, config) if args.nats_cluster == 1
                    else start_cluster(args.nats_cluster, state_dir, auth, config, tls))
        nats_url, bus, replicas = embedded.url, embedded.description, embedded.stream_replicas
    else:
        nats_url, bus, replicas = args.nats_url, f"NATS {args.nats_url}", None
    group = ProcessGroup(stop)
    try:
        overrides = _overrides(args, nats_url, model, replicas, os.environ)
        if mps is not None:
            overrides.update(mps.environment())
            bus = f"{bus}, {mps.describe()}"
        return _serve(args, plan, state_dir, overrides, model, bus, group, stop, auth, tls)
    finally:
        group.stop()
        if embedded is not None:
            embedded.stop()
        print("voxmesh stopped", file=sys.stderr)


def _serve(args, plan, state_dir: Path, overrides: dict[str, str], model: ModelChoice, bus: str,
           group: ProcessGroup, stop: threading.Event, auth: NatsAuth | None, tls: TlsDir | None) -> int:
    resume_secret = ensure_resume_secret(state_dir)
    for step in plan.one_shot:
        group.run_one_shot(step, _environment(step, overrides, auth, resume_secret, tls), timeout_s=120)
    for service in plan.services:
        placed = args.placements.get(service.name)
        group.start(service, _environment(service, overrides, auth, resume_secret, tls),
                    lambda replica, placed=placed: replica_environment(placed, replica))
    gateway = f"{'https' if tls is not None else 'http'}://127.0.0.1:{args.port}"
    if not _wait_ready(gateway, group, stop, tls):
        if group.exited_child is not None:
            print(f"voxmesh up: {group.exited_child.name} exited during start-up", file=sys.stderr)
        elif not stop.is_set():
            print(f"voxmesh up: the gateway was not ready within {READY_TIMEOUT_S:.0f}s", file=sys.stderr)
        return 1 if not stop.is_set() else 0
    print(f"voxmesh is serving: {gateway}  ({bus}, topology {plan.topology}, {model.describe()})",
          flush=True)
    stop.wait()
    if group.exited_child is not None:
        print(f"voxmesh up: {group.exited_child.name} exited; stopping the mesh", file=sys.stderr)
        return 1
    return 0
