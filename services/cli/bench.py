"""`voxmesh bench`: load-test a running mesh through its WebSocket streaming API (code in loadtest/bench/).

Loopback gateways only unless --allow-remote. Bounded: a number of requests and a time limit per level, a time
limit per request. Writes a JSON document (every request's metrics, per-level summaries, command, commit, date,
machine) and a PNG plot; prints a progress line per level on stderr and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shlex
import sys
from pathlib import Path

from loadtest.bench.client import TargetError, check_events_url, redacted, stream_url
from loadtest.bench.loadgen import Progress, Target
from loadtest.bench.metrics import Slo, SloError
from loadtest.bench.plot import PlotError, write_plot
from loadtest.bench.reference_voice import ReferenceVoice
from loadtest.bench.report import headline_rows
from loadtest.bench.stage_reader import EventsUnreachable
from loadtest.bench.sweep import BenchConfig, BenchError, run_bench, write_json
from loadtest.bench.workload import (
    DEFAULT_CONCURRENCIES,
    DEFAULT_PROMPTS,
    DEFAULT_RATES,
    MODES,
    LoadError,
    PayloadError,
    PromptsError,
    RequestShape,
    plan_levels,
)

_ERRORS = (TargetError, PromptsError, SloError, LoadError, PayloadError, BenchError, PlotError, EventsUnreachable)


def configure(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("targets")
    target.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default http://127.0.0.1:8000)")
    target.add_argument("--compare-url", help="a second gateway (another mesh configuration): levels alternate "
                                              "between the two and the report gives candidate/baseline ratios")
    target.add_argument("--label", help="name of --url in reports (default: mesh, or baseline when comparing)")
    target.add_argument("--compare-label", default="candidate", help="name of --compare-url (default candidate)")
    target.add_argument("--events-url", help="the --url mesh's NATS (nats://127.0.0.1:4222 for `voxmesh up`): read "
                                             "its lifecycle events after the run and break each first packet into "
                                             "stages (the bench must run on the mesh's host)")
    target.add_argument("--compare-events-url", help="the same for --compare-url")
    target.add_argument("--allow-remote", action="store_true", help="allow a gateway that is not on loopback")
    target.add_argument("--api-key", default=os.environ.get("VOXMESH_API_KEY"),
                        help="bearer token (default $VOXMESH_API_KEY)")
    load = parser.add_argument_group("load")
    load.add_argument("--mode", choices=(*MODES, "both"), default="both", help="open loop, closed loop, or both")
    load.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES),
                      help=f"open-loop Poisson arrival rates, requests/s (default {' '.join(map(str, DEFAULT_RATES))})")
    load.add_argument("--concurrency", type=int, nargs="+", default=list(DEFAULT_CONCURRENCIES),
                      help="closed-loop concurrencies (default 1 8 32 64)")
    load.add_argument("--requests", type=int, help="requests per level (default: 32 open; 2x concurrency, >= 16, "
                                                   "closed)")
    load.add_argument("--level-timeout", type=float, default=300.0, help="seconds one level may last (default 300)")
    load.add_argument("--request-timeout", type=float, default=120.0, help="seconds one request may last (120)")
    load.add_argument("--warmup", type=int, default=1, help="unmeasured requests per target first (default 1)")
    load.add_argument("--arrival-seed", type=int, default=0, help="seed of the Poisson arrival times")
    request = parser.add_argument_group("requests")
    request.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="id<TAB>text file (default "
                                                                               "../shared/data/prompts_en.tsv)")
    request.add_argument("--voice", default="ryan", help="speaker (default ryan; '' sends none)")
    request.add_argument("--language", default="auto")
    request.add_argument("--model", help="model name (default: the gateway's served model)")
    request.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    request.add_argument("--fixed-frames", type=int, help="fixed-length mode: ignore_eos with max_new_tokens = N "
                                                          "frames (random-weight checkpoints); labelled in the output")
    request.add_argument("--initial-chunk-frames", type=int, help="frames in the first chunk")
    request.add_argument("--temperature", type=float)
    clone = parser.add_argument_group("cloned voice (base checkpoints)")
    clone.add_argument("--ref-audio", type=Path, help="reference audio file sent with every request (then no --voice)")
    clone.add_argument("--ref-text", help="its transcript (in-context cloning)")
    clone.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    clone.add_argument("--distinct-references", action="store_true",
                       help="each request's copy starts after its own short silence, so each pays the whole audio work, "
                            "the vocoder's priming included (no cache)")
    slo = parser.add_argument_group("SLO")
    slo.add_argument("--slo-first-packet", type=float, default=0.5, help="goodput: first packet within S seconds")
    slo.add_argument("--slo-allow-gaps", action="store_true", help="goodput without requiring continuous streams")
    slo.add_argument("--p95-first-packet-bound", type=float, help="a rate is sustained only with p95 first packet "
                                                                  "within S seconds (default: --slo-first-packet)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, help="JSON file (default bench-<UTC time>.json)")
    out.add_argument("--plot", type=Path, help="PNG file (default: the JSON's name with .png)")
    out.add_argument("--no-plot", action="store_true", help="skip the PNG")


def build_config(args: argparse.Namespace) -> BenchConfig:
    """Turn parsed flags into a BenchConfig (raises the loadtest errors on bad values)."""
    targets = [Target(args.label or ("baseline" if args.compare_url else "mesh"),
                      stream_url(args.url, allow_remote=args.allow_remote))]
    if args.compare_url:
        targets.append(Target(args.compare_label, stream_url(args.compare_url, allow_remote=args.allow_remote)))
    modes = MODES if args.mode == "both" else (args.mode,)
    slo = Slo(first_packet_s=args.slo_first_packet, require_continuous=not args.slo_allow_gaps)
    reference = None
    if args.ref_audio is not None:
        reference = ReferenceVoice.from_file(args.ref_audio, args.ref_text, args.x_vector_only,
                                             args.distinct_references)
    shape = RequestShape(voice=None if reference is not None else args.voice or None, language=args.language,
                         model=args.model, fixed_frames=args.fixed_frames,
                         initial_chunk_frames=args.initial_chunk_frames, temperature=args.temperature, seed=args.seed,
                         reference=reference)
    if args.compare_events_url and not args.compare_url:
        raise LoadError("--compare-events-url needs --compare-url, the gateway whose mesh it names")
    for url in (args.events_url, args.compare_events_url):
        if url is not None:
            check_events_url(url, allow_remote=args.allow_remote)
    for name in ("level_timeout", "request_timeout"):
        if not getattr(args, name) > 0:
            raise LoadError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        raise LoadError(f"--warmup must be 0 or more, got {args.warmup}")
    return BenchConfig(targets=tuple(targets), levels=tuple(plan_levels(modes, rates=args.rates,
                                                                        concurrencies=args.concurrency,
                                                                        num_requests=args.requests)),
                       shape=shape, slo=slo, p95_first_packet_bound_s=args.p95_first_packet_bound or slo.first_packet_s,
                       prompts_path=args.prompts, level_timeout_s=args.level_timeout,
                       request_timeout_s=args.request_timeout, warmup=args.warmup, api_key=args.api_key,
                       arrival_seed=args.arrival_seed,
                       events_urls=(args.events_url, args.compare_events_url)[:len(targets)])


def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 once it has written its outputs (failed requests are data, in the JSON), 2 on bad input."""
    try:
        config = build_config(args)
        words = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
        command = "voxmesh bench " + shlex.join(redacted(word) for word in words)
        document = asyncio.run(run_bench(config, command=command, progress=Progress(sys.stderr)))
        out = args.out or Path(f"bench-{datetime.datetime.now(datetime.UTC):%Y%m%d-%H%M%S}.json")
        write_json(document, out)
        written = [str(out)]
        if not args.no_plot:
            written.append(str(write_plot(document, args.plot or out.with_suffix(".png"))))
    except _ERRORS as error:
        print(f"voxmesh bench: {error.code}: {error}", file=sys.stderr)
        return 2
    print("\n".join(headline_rows(document)))
    print(f"wrote {', '.join(written)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m services.cli.bench ...`, the same as `voxmesh bench ...`."""
    parser = argparse.ArgumentParser(prog="voxmesh bench", description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
