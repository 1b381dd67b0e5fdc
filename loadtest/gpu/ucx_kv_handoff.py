"""KV hand-off between two processes on one device through UCX (ucxx): bandwidth and latency, data checked.

Starts a sender and a receiver (`loadtest.gpu.ucx_kv_peer`) per UCX transport setting, relays their worker
addresses through their stdin/stdout pipes (out of band: nobody listens), and gathers the timings of each
(prompt length, mode) trial and the receiver's bit-for-bit checks into one JSON report. On a GPU both pools
live on the same device and UCX moves the blocks by CUDA IPC (`cuda_ipc` among the active transports).

    python -m loadtest.gpu.ucx_kv_handoff --out ucx.json --device cuda [--tokens 64 200 500 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.gpu.ucx_kv_blocks import HandoffSpec

MODES = ("ping", "per_block", "staged")
DEFAULT_SETTINGS = {"cuda": ["default", "cuda_copy,cuda_ipc,tcp,self,sm"], "cpu": ["default"]}


class HandoffError(RuntimeError):
    """A peer failed or broke the protocol; `code` is machine-readable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def plan_trials(tokens: list[int], modes: list[str], warmup: int, reps: int) -> list[dict]:
    trials, ident = [], 0
    for mode in modes:
        for count in ([1] if mode == "ping" else tokens):
            trials.append({"id": ident, "mode": mode, "tokens": count, "seed": 1000 + ident,
                           "warmup": warmup, "reps": reps})
            ident += 1
    return trials


def _peer_env(ucx_tls: str) -> dict[str, str]:
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
    env.pop("UCX_TLS", None)
    if ucx_tls != "default":
        env["UCX_TLS"] = ucx_tls
    return env


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""


def _read_address(proc: subprocess.Popen, role: str, log: Path) -> str:
    """The peer's 'ADDR <hex>' line (UCX may print other lines first)."""
    for line in proc.stdout:
        if line.startswith("ADDR "):
            return line
    raise HandoffError(f"the {role} exited before printing its worker address (rc {proc.wait()}); "
                       f"stderr tail:\n{_log_tail(log)}", "no_address")


def _result(stdout: str, role: str, rc: int, log: Path) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise HandoffError(f"the {role} gave no result (rc {rc}); stderr tail:\n{_log_tail(log)}", "no_result")


def run_pair(plan: dict, ucx_tls: str, logs: Path, timeout_s: float) -> dict:
    """Run one sender/receiver pair over `plan` with UCX_TLS=`ucx_tls`; returns both peers' results."""
    env, procs, outputs = _peer_env(ucx_tls), {}, {}
    log_of = {role: logs / f"{role}.{ucx_tls.replace(',', '_')}.log" for role in ("receiver", "sender")}
    for role, log in log_of.items():
        command = [sys.executable, "-m", "loadtest.gpu.ucx_kv_peer", "--role", role, "--plan", json.dumps(plan)]
        with log.open("w") as stderr:
            procs[role] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=stderr, text=True, env=env)
    try:
        addresses = {role: _read_address(proc, role, log_of[role]) for role, proc in procs.items()}
        procs["receiver"].stdin.write(addresses["sender"])
        procs["sender"].stdin.write(addresses["receiver"])
        for proc in procs.values():
            proc.stdin.flush()  # communicate() below closes stdin
        for role, proc in procs.items():
            stdout, _ = proc.communicate(timeout=timeout_s)
            outputs[role] = _result(stdout, role, proc.returncode, log_of[role])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def summarise(spec: HandoffSpec, sender: dict, receiver: dict) -> list[dict]:
    """One row per trial: time, bandwidth, and whether every received copy matched."""
    checks = {row["id"]: row for row in receiver["trials"]}
    rows = []
    for trial in sender["trials"]:
        nbytes = 0 if trial["mode"] == "ping" else spec.blocks_for(trial["tokens"]) * spec.block_bytes
        check = checks[trial["id"]]
        rows.append({
            **trial, "bytes": nbytes,
            "bandwidth_gb_per_s": nbytes / (trial["median_ms"] / 1000) / 1e9 if nbytes else None,
            "checked": check["checked"], "all_equal": check["all_equal"] if trial["mode"] != "ping" else None,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 200, 500, 1000])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--ucx-tls", nargs="+", help="UCX_TLS settings to compare ('default' leaves it unset)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--spec", default="{}", help="JSON HandoffSpec fields (default: the 0.6B talker)")
    parser.add_argument("--logs", type=Path, help="folder for the peers' stderr (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    spec = HandoffSpec(**{**json.loads(args.spec), "device": args.device})
    for count in args.tokens:
        spec.blocks_for(count)  # refuse impossible prompt lengths before starting anything
    plan = {"spec": spec.to_dict(), "trials": plan_trials(args.tokens, args.modes, args.warmup, args.reps)}
    report = {"benchmark": "ucx_kv_handoff", "commit": args.commit, "spec": spec.to_dict(),
              "block_bytes": spec.block_bytes, "runs": []}
    with tempfile.TemporaryDirectory() as scratch:
        logs = args.logs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        for ucx_tls in args.ucx_tls or DEFAULT_SETTINGS[args.device]:
            outputs = run_pair(plan, ucx_tls, logs, args.timeout)
            rows = summarise(spec, outputs["sender"], outputs["receiver"])
            report["runs"].append({"ucx_tls": ucx_tls, "active_transports": outputs["sender"]["active_transports"],
                                   "trials": rows})
            args.out.write_text(json.dumps(report, indent=2) + "\n")
            for row in rows:
                bandwidth = f"{row['bandwidth_gb_per_s']:8.1f} GB/s" if row["bandwidth_gb_per_s"] else " " * 13
                print(f"ucx {ucx_tls:28s} {row['mode']:9s} {row['tokens']:5d} tok {row['median_ms']:8.3f} ms "
                      f"{bandwidth} equal={row['all_equal']}", flush=True)
    failed = any(row["all_equal"] is False for run in report["runs"] for row in run["trials"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
