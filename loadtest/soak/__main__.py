"""`python -m loadtest.soak [--duration-s 600] [--warmup-s 60] [--rate R | --concurrency N]`: the soak (see the
package docstring). Writes loadtest/results/soak_<label>_<date>.json and .md; the mesh's state and log and the bench's
own JSON stay in a work directory the JSON names. Exits 1 when something is not flat, 2 on flags that make no soak."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import shlex
import sys
import tempfile
from pathlib import Path

from loadtest.soak.bench_argv import check_bench_args
from loadtest.soak.config import SoakArgsError, SoakConfig
from loadtest.soak.flatness import markdown
from loadtest.soak.soak_run import REPO, soak

DEFAULT_CONCURRENCY = 4


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds of load between the samples (600)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="seconds of load before the first sample (60)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help=f"closed-loop clients ({DEFAULT_CONCURRENCY}; the default load)")
    load.add_argument("--rate", type=float, help="open loop instead: Poisson arrivals at R requests/s")
    parser.add_argument("--fixed-frames", type=int, default=48,
                        help="frames per request (48), unless --bench-args pick a length (--length-mode or "
                             "--fixed-frames)")
    parser.add_argument("--up-args", default="", help="extra flags for the soak's `voxmesh up`, one string "
                                                      "(--up-args \"--model /tmp/ckpt --device cuda\")")
    parser.add_argument("--bench-args", default="", help="extra flags for every `voxmesh bench` of the soak, one "
                                                         "string (--bench-args \"--transport http --length-mode "
                                                         "realistic\")")
    parser.add_argument("--window-s", type=float, default=60.0, help="the latency verdict compares the requests "
                                                                     "started in the first and the last window (60)")
    parser.add_argument("--start-timeout-s", type=float, default=300.0,
                        help="seconds `voxmesh up` may take to serve (300: a GPU mesh loads and captures graphs)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "loadtest" / "results", help="loadtest/results")
    parser.add_argument("--label", default="cpu", help="names the outputs (cpu)")
    return parser


def config_of(args: argparse.Namespace, work_dir: Path) -> SoakConfig:
    """The soak the flags describe; SoakArgsError when they describe none."""
    bench_args = tuple(shlex.split(args.bench_args))
    check_bench_args(bench_args)
    return SoakConfig(duration_s=args.duration_s, warmup_s=args.warmup_s,
                      concurrency=DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency,
                      fixed_frames=args.fixed_frames, work_dir=work_dir, rate=args.rate,
                      up_args=tuple(shlex.split(args.up_args)), bench_args=bench_args, window_s=args.window_s,
                      start_timeout_s=args.start_timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = config_of(args, Path("."))  # checked before a work directory is made for it
    except ValueError as error:  # SoakArgsError, or a quote shlex found unclosed
        print(f"python -m loadtest.soak: {getattr(error, 'code', 'invalid_soak_args')}: {error}", file=sys.stderr)
        return 2
    config = dataclasses.replace(config, work_dir=Path(tempfile.mkdtemp(prefix="voxmesh-soak-")))
    command = shlex.join(["python", "-m", "loadtest.soak", *(sys.argv[1:] if argv is None else argv)])
    document = asyncio.run(soak(config, command))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"soak_{args.label}_{datetime.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    table = markdown(document)
    stem.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {stem}.json, {stem}.md", file=sys.stderr)
    return 0 if document["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
