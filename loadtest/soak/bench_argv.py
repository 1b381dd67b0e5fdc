"""The `voxmesh bench` command lines a soak runs: one level bounded by the soak's seconds, open loop (Poisson
arrivals at the soak's rate, enough requests to fill the time) or closed loop (the soak's clients), plus the user's
own bench flags."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from loadtest.soak.config import SoakArgsError, SoakConfig

CLOSED_LOOP_REQUESTS = 1_000_000
"""A count the closed loop cannot reach within a soak: its time limit ends it."""
OPEN_LOOP_MARGIN_SIGMAS = 5.0
OPEN_LOOP_MARGIN_MIN = 8
"""The open loop's arrivals in `s` seconds are Poisson (mean and variance R x s): five standard deviations (and a few
more for small counts) past the mean keep the count from running out before the time limit does, so the level lasts
its seconds."""
OWNED_FLAGS = frozenset({"--url", "--mode", "--rates", "--rate-ladder", "--concurrency", "--requests",
                         "--level-timeout", "--warmup", "--out", "--plot", "--no-plot", "--events-url", "--sweep",
                         "--trials", "--fresh-mesh", "--up-args", "--mesh-log-dir", "--compare-url",
                         "--compare-events-url"})
"""Flags the soak sets (or that would make it another kind of run): refused in --bench-args."""
LENGTH_FLAGS = frozenset({"--length-mode", "--fixed-frames"})


def flag_names(args: Sequence[str]) -> set[str]:
    """The long flags among `args` (`--name` or `--name=value`)."""
    return {word.partition("=")[0] for word in args if word.startswith("--")}


def check_bench_args(bench_args: Sequence[str]) -> None:
    """SoakArgsError when the user's bench flags include one the soak sets itself."""
    clashing = sorted(flag_names(bench_args) & OWNED_FLAGS)
    if clashing:
        raise SoakArgsError(f"--bench-args may not set {', '.join(clashing)}: the soak sets them (use --rate, "
                            "--concurrency, --duration-s)")


def picks_length(bench_args: Sequence[str]) -> bool:
    """Whether the user's bench flags choose the requests' length (then the soak's --fixed-frames is left out: the
    bench refuses --fixed-frames beside any length mode but `fixed`)."""
    return bool(flag_names(bench_args) & LENGTH_FLAGS)


def open_loop_requests(rate: float, seconds: float) -> int:
    """Enough requests for Poisson arrivals at `rate` to last `seconds` (see OPEN_LOOP_MARGIN_SIGMAS)."""
    expected = rate * seconds
    return math.ceil(expected) + max(OPEN_LOOP_MARGIN_MIN, math.ceil(OPEN_LOOP_MARGIN_SIGMAS * math.sqrt(expected)))


def bench_argv(config: SoakConfig, gateway_url: str, seconds: float, out: Path,
               events_url: str | None = None) -> list[str]:
    """`voxmesh bench`'s arguments (after the program) for one level of `seconds` against `gateway_url`, its JSON
    to `out`; with `events_url`, each first packet broken into stages."""
    if config.rate is not None:
        load = ["--mode", "open", "--rates", str(config.rate),
                "--requests", str(open_loop_requests(config.rate, seconds))]
    else:
        load = ["--mode", "closed", "--concurrency", str(config.concurrency), "--requests", str(CLOSED_LOOP_REQUESTS)]
    length = [] if picks_length(config.bench_args) else ["--fixed-frames", str(config.fixed_frames)]
    events = [] if events_url is None else ["--events-url", events_url]
    return ["bench", "--url", gateway_url, *load, "--level-timeout", f"{seconds:g}", *length, "--warmup", "0",
            *events, "--no-plot", "--out", str(out), *config.bench_args]
