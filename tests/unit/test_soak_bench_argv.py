"""The soak's `voxmesh bench` command lines (loadtest/soak/bench_argv.py) and its own flags: open loop or closed loop,
the user's bench flags appended, the soak's --fixed-frames left out where those pick a length, and every line one
that `voxmesh bench`'s own parser and checks accept."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtest.soak.__main__ import config_of, parser
from loadtest.soak.bench_argv import bench_argv, check_bench_args, open_loop_requests, picks_length
from loadtest.soak.config import SoakArgsError, SoakConfig
from services.cli import bench as bench_cli

GATEWAY = "http://127.0.0.1:8123"
EVENTS = "nats://127.0.0.1:4333"
OUT = Path("/tmp/soak/bench.json")


def soak_config(**changes) -> SoakConfig:
    fields = {"duration_s": 600.0, "warmup_s": 60.0, "concurrency": 4, "fixed_frames": 48, "work_dir": Path("/tmp")}
    return SoakConfig(**(fields | changes))


def bench_accepts(argv: list[str]):
    """What `voxmesh bench` makes of `argv` (its parser and its config checks): raises where it would refuse."""
    assert argv[0] == "bench"
    bench_parser = argparse.ArgumentParser()
    bench_cli.configure(bench_parser)
    args = bench_parser.parse_args(argv[1:])
    return args, bench_cli.build_config(args)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_closed_loop_is_the_old_default_line():
    argv = bench_argv(soak_config(), GATEWAY, 600.0, OUT)
    assert argv == ["bench", "--url", GATEWAY, "--mode", "closed", "--concurrency", "4", "--requests", "1000000",
                    "--level-timeout", "600", "--fixed-frames", "48", "--warmup", "0", "--no-plot", "--out", str(OUT)]
    args, config = bench_accepts(argv)
    assert [(level.mode, level.load) for level in config.levels] == [("closed", 4)]
    assert config.level_timeout_s == 600.0 and config.shape.fixed_frames == 48 and config.events_urls == (None,)


def test_the_open_loop_sends_enough_poisson_arrivals_to_fill_the_time():
    config = soak_config(rate=28.0)
    argv = bench_argv(config, GATEWAY, 600.0, OUT, EVENTS)
    assert "--concurrency" not in argv and flag(argv, "--mode") == "open" and flag(argv, "--rates") == "28.0"
    requests = int(flag(argv, "--requests"))
    assert requests == open_loop_requests(28.0, 600.0)
    # 16,800 arrivals expected, standard deviation 130: five of them past the mean
    assert 16_800 + 5 * 129 < requests < 16_800 + 5 * 131 + 1
    assert open_loop_requests(0.1, 10.0) == 1 + 8, "a handful of arrivals still gets a margin"
    _, bench_config = bench_accepts(argv)
    assert [(level.mode, level.load, level.num_requests) for level in bench_config.levels] == [("open", 28.0, requests)]
    assert bench_config.events_urls == (EVENTS,)


def test_the_users_length_mode_replaces_the_soaks_fixed_frames():
    bench_args = ("--transport", "http", "--length-mode", "realistic", "--prompts", "/tmp/prompts.tsv")
    argv = bench_argv(soak_config(rate=1.0, bench_args=bench_args), GATEWAY, 40.0, OUT, EVENTS)
    assert "--fixed-frames" not in argv and argv[-len(bench_args):] == list(bench_args)
    args, config = bench_accepts(argv)
    assert config.shape.realistic_length and config.targets[0].transport == "http"
    assert args.prompts == Path("/tmp/prompts.tsv")
    # without the soak's care, the bench would refuse the line
    with pytest.raises(bench_cli.PayloadError, match="excludes --fixed-frames"):
        bench_accepts([*argv[:-len(bench_args)], "--fixed-frames", "48", *bench_args])


def test_a_length_flag_in_either_spelling_counts_and_the_soaks_own_flags_are_refused():
    assert picks_length(["--length-mode=natural"]) and picks_length(["--fixed-frames", "12"])
    assert not picks_length(["--transport", "http", "--prompts", "fixed-frames.tsv"])
    check_bench_args(["--transport", "http", "--length-mode", "realistic"])
    for owned in (["--mode", "open"], ["--rates=3"], ["--out", "x.json"], ["--events-url", EVENTS]):
        with pytest.raises(SoakArgsError, match=owned[0].partition("=")[0]):
            check_bench_args(owned)


def test_the_soaks_flags_make_one_mode_and_split_the_extra_flags():
    gpu = parser().parse_args(["--rate", "28", "--up-args", "--model /tmp/ckpt17 --device cuda --dtype bfloat16",
                               "--bench-args", "--transport http --length-mode realistic", "--window-s", "30"])
    config = config_of(gpu, Path("/tmp"))
    assert config.rate == 28.0 and config.is_open_loop and config.describe_load() == "open loop at 28/s"
    assert config.up_args == ("--model", "/tmp/ckpt17", "--device", "cuda", "--dtype", "bfloat16")
    assert config.bench_args == ("--transport", "http", "--length-mode", "realistic") and config.window_s == 30.0
    assert config.start_timeout_s == 300.0
    cpu = config_of(parser().parse_args([]), Path("/tmp"))
    assert (cpu.rate, cpu.concurrency, cpu.fixed_frames, cpu.up_args, cpu.bench_args) == (None, 4, 48, (), ())
    assert cpu.describe_load() == "closed loop x4"
    with pytest.raises(SystemExit):
        parser().parse_args(["--rate", "2", "--concurrency", "4"])
    with pytest.raises(SoakArgsError, match="rate must be positive"):
        config_of(parser().parse_args(["--rate", "0"]), Path("/tmp"))
    with pytest.raises(SoakArgsError, match="--mode"):
        config_of(parser().parse_args(["--bench-args", "--mode open"]), Path("/tmp"))
