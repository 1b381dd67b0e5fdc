"""`voxmesh bench`: load-test a mesh through its WebSocket streaming API or its HTTP speech API (raw PCM streamed;
code in loadtest/bench/).

Loopback gateways only unless --allow-remote. Bounded: a number of requests and a time limit per level, a time
limit per request. Writes a JSON document (every request's metrics, per-level summaries, command, commit, date,
machine) and a PNG plot; prints a progress line per level on stderr and a table on stdout. The public open-loop
method: `--transport http --mode open --sweep --length-mode realistic --trials 3 --fresh-mesh` (gate.py, trials.py).
A gateway with API keys gets the one in `VOXMESH_API_KEY` (or in the file `VOXMESH_API_KEY_FILE` names).
`--response-format` and `--sample-rate` ask for the audio in another format or rate (HTTP: any format, decoded as it
streams; the WebSocket: pcm, ulaw, alaw); the document records both.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.audio_decode import DECODED_FORMATS
from loadtest.bench.client import STREAM_FORMAT_OF, TargetError, check_events_url, redacted
from loadtest.bench.fresh_mesh import MeshLauncher, MeshStartError
from loadtest.bench.gate import Gate, rate_ladder
from loadtest.bench.http_speech import endpoint_url
from loadtest.bench.length_mode import FRAMES_PER_WORD, LENGTH_MODES
from loadtest.bench.loadgen import TRANSPORTS, Progress, Target
from loadtest.bench.metrics import Slo, SloError
from loadtest.bench.plot import PlotError, write_plot
from loadtest.bench.reference_voice import ReferenceVoice
from loadtest.bench.report import headline_rows
from loadtest.bench.stage_reader import EventsUnreachable
from loadtest.bench.sweep import BenchConfig, BenchError, write_json
from loadtest.bench.trials import run_trials
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
from services.runtime.settings_schema import SettingsError, resolve, setting

_ERRORS = (TargetError, PromptsError, SloError, LoadError, PayloadError, BenchError, PlotError, EventsUnreachable,
           MeshStartError)
DEFAULT_URL = "http://127.0.0.1:8000"
RESPONSE_FORMATS = ("pcm", *DECODED_FORMATS)


@dataclass(frozen=True, slots=True)
class BenchCredentials:
    """What the bench presents to a gateway, read as the services read their secrets (the variable or its _FILE
    form): never a flag, which `ps` shows and the report's recorded command would keep."""

    api_key: str | None = setting(None, "the gateway's API key, sent as a bearer token", secret=True)


def api_key() -> str | None:
    """The key of `BenchCredentials` (VOXMESH_API_KEY or VOXMESH_API_KEY_FILE), or None."""
    try:
        return resolve(BenchCredentials).api_key
    except SettingsError as error:
        raise TargetError("unreadable_api_key", str(error)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("targets")
    target.add_argument("--url", help=f"the gateway (default {DEFAULT_URL}; not with --fresh-mesh)")
    target.add_argument("--transport", choices=TRANSPORTS, default="websocket",
                        help="websocket: /v1/audio/speech/stream; http: POST /v1/audio/speech, raw PCM streamed "
                             "(the public method's transport)")
    target.add_argument("--compare-url", help="a second gateway (another mesh configuration): levels alternate "
                                              "between the two and the report gives candidate/baseline ratios")
    target.add_argument("--label", help="name of --url in reports (default: mesh, or baseline when comparing)")
    target.add_argument("--compare-label", default="candidate", help="name of --compare-url (default candidate)")
    target.add_argument("--events-url", help="the --url mesh's NATS (nats://127.0.0.1:4222 for `voxmesh up`): read "
                                             "its lifecycle events after the run and break each first packet into "
                                             "stages (the bench must run on the mesh's host)")
    target.add_argument("--compare-events-url", help="the same for --compare-url")
    target.add_argument("--allow-remote", action="store_true", help="allow a gateway that is not on loopback")
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
    load.add_argument("--arrival-seed", type=int, default=0, help="seed of the Poisson arrival times (trial k: +k)")
    load.add_argument("--rate-ladder", type=float, nargs=3, metavar=("START", "STOP", "FACTOR"),
                      help="open-loop rates START, START x FACTOR, ... up to STOP (instead of --rates)")
    load.add_argument("--sweep", action="store_true", help="open loop only: run the rates in ascending order and stop "
                                                           "after the first that fails the gate")
    load.add_argument("--trials", type=int, default=1, help="repeat the whole run N times (arrival seeds "
                                                            "--arrival-seed + 0..N-1); figures: median, min-max")
    load.add_argument("--fresh-mesh", action="store_true", help="start a new `voxmesh up` for every trial (its "
                                                                "warm-up not counted), stop it after")
    load.add_argument("--up-args", default="", help="flags for each fresh mesh's `voxmesh up`, one string written "
                                                    "with = (--up-args=\"--model ./ckpt --device cuda\"; the bench "
                                                    "picks --port and --state-dir)")
    load.add_argument("--mesh-log-dir", type=Path, help="keep each fresh mesh's output there (trialK.log)")
    request = parser.add_argument_group("requests")
    request.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="id<TAB>text file (default "
                                                                               "../shared/data/prompts_en.tsv)")
    request.add_argument("--voice", default="ryan", help="speaker (default ryan; '' sends none)")
    request.add_argument("--language", default="auto")
    request.add_argument("--model", help="model name (default: the gateway's served model)")
    request.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    request.add_argument("--fixed-frames", type=int, help="fixed-length mode: ignore_eos with max_new_tokens = N "
                                                          "frames (random-weight checkpoints); labelled in the output")
    request.add_argument("--length-mode", choices=LENGTH_MODES,
                         help=f"natural (until EOS), fixed (--fixed-frames) or realistic: min = max new tokens = "
                              f"{FRAMES_PER_WORD:g} frames a word of the prompt (4.5 s mean on the shared prompts; "
                              "random-weight checkpoints); default: fixed with --fixed-frames, else natural")
    request.add_argument("--initial-chunk-frames", type=int, help="frames in the first chunk")
    request.add_argument("--response-format", choices=RESPONSE_FORMATS, default="pcm",
                         help="the audio's format (default pcm); not pcm: decoded as it streams, so first audio and "
                              "underruns are measured on what a player could play (the WebSocket: pcm, ulaw, alaw)")
    request.add_argument("--sample-rate", type=int, help="ask for the audio at this rate in Hz (`sample_rate`; default: "
                                                         "the format's own, 24000, G.711 8000)")
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
    slo.add_argument("--p95-bound-ms", type=float, help="the gate also needs the p95 first audible sample within "
                                                        "this many ms (issue 41's target: 50)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, help="JSON file (default bench-<UTC time>.json)")
    out.add_argument("--plot", type=Path, help="PNG file (default: the JSON's name with .png)")
    out.add_argument("--no-plot", action="store_true", help="skip the PNG")


def _targets(args: argparse.Namespace) -> list[Target]:
    if args.fresh_mesh and (args.url or args.compare_url or args.events_url):
        raise LoadError("--fresh-mesh starts its own gateway: leave out --url, --compare-url and --events-url")
    url = args.url or DEFAULT_URL  # a fresh mesh's URL replaces it per trial
    targets = [Target(args.label or ("baseline" if args.compare_url else "mesh"),
                      endpoint_url(url, args.transport, allow_remote=args.allow_remote), args.transport)]
    if args.compare_url:
        targets.append(Target(args.compare_label, endpoint_url(args.compare_url, args.transport,
                                                               allow_remote=args.allow_remote), args.transport))
    return targets


def _length(args: argparse.Namespace) -> bool:
    """Whether the realistic length mode is on (refuses modes that contradict --fixed-frames)."""
    mode = args.length_mode or ("natural" if args.fixed_frames is None else "fixed")
    if (mode == "fixed") != (args.fixed_frames is not None):
        raise PayloadError(f"--length-mode {mode} {'needs' if mode == 'fixed' else 'excludes'} --fixed-frames")
    return mode == "realistic"


def _rates(args: argparse.Namespace) -> list[float]:
    return rate_ladder(*args.rate_ladder) if args.rate_ladder else args.rates


def _check_format(args: argparse.Namespace) -> None:
    """The WebSocket sends PCM or G.711 only; every format goes over HTTP."""
    if args.transport == "websocket" and args.response_format not in STREAM_FORMAT_OF:
        raise PayloadError(f"--response-format {args.response_format} goes with --transport http (the WebSocket "
                           f"sends {', '.join(STREAM_FORMAT_OF)})")


def build_config(args: argparse.Namespace) -> BenchConfig:
    """Turn parsed flags into a BenchConfig (raises the loadtest errors on bad values)."""
    targets = _targets(args)
    _check_format(args)
    modes = MODES if args.mode == "both" else (args.mode,)
    if args.sweep and args.mode != "open":
        raise LoadError("--sweep runs open-loop levels: add --mode open")
    slo = Slo(first_packet_s=args.slo_first_packet, require_continuous=not args.slo_allow_gaps)
    reference = None
    if args.ref_audio is not None:
        reference = ReferenceVoice.from_file(args.ref_audio, args.ref_text, args.x_vector_only,
                                             args.distinct_references)
    shape = RequestShape(voice=None if reference is not None else args.voice or None, language=args.language,
                         model=args.model, fixed_frames=args.fixed_frames,
                         initial_chunk_frames=args.initial_chunk_frames, temperature=args.temperature, seed=args.seed,
                         reference=reference, realistic_length=_length(args), response_format=args.response_format,
                         sample_rate=args.sample_rate)
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
    gate = Gate(p95_first_audible_bound_s=None if args.p95_bound_ms is None else args.p95_bound_ms / 1000.0)
    return BenchConfig(targets=tuple(targets), levels=tuple(plan_levels(modes, rates=_rates(args),
                                                                        concurrencies=args.concurrency,
                                                                        num_requests=args.requests)),
                       shape=shape, slo=slo, p95_first_packet_bound_s=args.p95_first_packet_bound or slo.first_packet_s,
                       prompts_path=args.prompts, level_timeout_s=args.level_timeout,
                       request_timeout_s=args.request_timeout, warmup=args.warmup, api_key=api_key(),
                       arrival_seed=args.arrival_seed,
                       events_urls=(args.events_url, args.compare_events_url)[:len(targets)], gate=gate,
                       sweep=args.sweep)


def build_launcher(args: argparse.Namespace) -> MeshLauncher | None:
    """The fresh-mesh launcher (--fresh-mesh), or None."""
    if not args.fresh_mesh:
        if args.up_args or args.mesh_log_dir:
            raise LoadError("--up-args and --mesh-log-dir go with --fresh-mesh")
        return None
    return MeshLauncher(up_args=tuple(shlex.split(args.up_args)), log_dir=args.mesh_log_dir)


def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 once it has written its outputs (failed requests are data, in the JSON), 2 on bad input."""
    try:
        config = build_config(args)
        launcher = build_launcher(args)
        words = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
        command = "voxmesh bench " + shlex.join(redacted(word) for word in words)
        document = asyncio.run(run_trials(config, trials=args.trials, launcher=launcher, command=command,
                                          progress=Progress(sys.stderr)))
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
