"""Helpers shared by the bench's end-to-end tests (stand-in gateway and real mesh): run `voxmesh bench` and
Locust as real subprocesses, and check what they wrote. No tests here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from messages.audio_format import BYTES_PER_SAMPLE, SAMPLE_RATE

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LEVEL_FIELDS = {"num_requests", "num_completed", "num_failed", "num_not_sent", "errors", "wall_s", "requests_per_s",
                "audio_s", "audio_s_per_s", "first_packet_s", "latency_s", "rtf", "chunk_interval_s",
                "max_underrun_s", "num_gaps", "continuous_share", "goodput_count", "goodput_share", "goodput_per_s"}
STAT_FIELDS = {"count", "mean", "median", "p90", "p95", "p99", "min", "max"}


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def write_prompts(directory: Path, count: int = 5) -> Path:
    """A small prompts file (the shared one is used by default; tests need no file outside the repo)."""
    path = directory / "prompts.tsv"
    path.write_text("".join(f"t{number:02d}\tTest sentence number {number}, spoken briefly.\n"
                            for number in range(count)))
    return path


def _env() -> dict:
    # The checkout may not be pip-installed: make `loadtest` and `services` importable from the subprocess.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


async def run_process(*command: str, timeout_s: float = 180.0) -> Finished:
    """Run a command from the repo root without blocking the event loop (the gateway under test runs on it)."""
    process = await asyncio.create_subprocess_exec(*command, cwd=REPO, env=_env(), stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"{command[:4]}... ran past {timeout_s} s")
    return Finished(process.returncode, stdout.decode(), stderr.decode())


def bench_command(*args: str) -> list[str]:
    """`voxmesh bench ARGS`, run through this interpreter."""
    return [sys.executable, "-m", "services.cli", "bench", *args]


async def run_bench(*args: str) -> Finished:
    return await run_process(*bench_command(*args))


def check_bench_document(path: Path, *, levels: list[tuple[str, float]], num_requests: int,
                         audio_s_per_request: float) -> dict:
    """The JSON has every field, each level ran the requested number of requests without an error, and the audio
    seconds add up (per request, per level) to what each request had to make."""
    document = json.loads(path.read_text())
    assert document["schema"] == "voxmesh.bench/1"
    assert {"command", "date", "commit", "dirty", "machine"} <= set(document["meta"])
    assert document["meta"]["machine"]["cpu_count"] >= 1
    for target in document["targets"]:
        assert [(level["level"]["mode"], level["level"]["load"]) for level in target["levels"]] == levels
        for level in target["levels"]:
            summary = level["summary"]
            assert LEVEL_FIELDS <= set(summary)
            assert all(STAT_FIELDS == set(summary[name]) for name in ("first_packet_s", "latency_s", "rtf"))
            assert (summary["num_requests"], summary["num_completed"]) == (num_requests, num_requests)
            assert (summary["num_failed"], summary["num_not_sent"], summary["errors"]) == (0, 0, {})
            requests = level["requests"]
            assert sorted(request["index"] for request in requests) == list(range(num_requests))
            assert all(request["ok"] and request["first_packet_s"] <= request["latency_s"] for request in requests)
            assert all(request["audio_s"] == pytest.approx(audio_s_per_request) for request in requests)
            assert summary["audio_s"] == pytest.approx(num_requests * audio_s_per_request)
            assert summary["audio_s_per_s"] == pytest.approx(summary["audio_s"] / summary["wall_s"])
            assert summary["first_packet_s"]["count"] == num_requests
            assert level["sustained"] in ((True, False) if level["level"]["mode"] == "open" else (None,))
    return document


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000  # a real figure, not an empty canvas


def locust_command(host: str, out: Path, prompts: Path, *, users: int, streams: int, run_time: str,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """A headless, bounded Locust run on loopback writing its stats to `out`.json."""
    return [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "bench" / "locustfile.py"), "--headless",
            "--web-host", "127.0.0.1", "--host", host, "-u", str(users), "-r", str(users), "-t", run_time,
            "--stream-requests", str(streams), "--prompts", str(prompts), "--json-file", str(out),
            "--only-summary", "--loglevel", "WARNING", *extra]


def check_locust_stats(path: Path, *, num_streams: int, bytes_per_stream: int) -> dict[str, dict]:
    """Locust's JSON stats: `num_streams` streams and first packets, no failure, every PCM byte accounted for."""
    entries = {entry["name"]: entry for entry in json.loads(path.read_text())}
    assert set(entries) == {"first_packet", "stream", "max_underrun"}
    for name in ("first_packet", "stream", "max_underrun"):
        assert entries[name]["method"] == "WS"
        assert (entries[name]["num_requests"], entries[name]["num_failures"]) == (num_streams, 0)
    assert entries["stream"]["total_content_length"] == num_streams * bytes_per_stream
    first_packet = entries["first_packet"]["total_response_time"]
    assert 0 < first_packet <= entries["stream"]["total_response_time"]
    return entries
