"""The soak's verdicts: is every process flat (memory within 5% of its start, descriptors and threads equal), is the
bus bounded (REQUESTS empty, every durable consumer caught up, nothing kept past its stream's retention), and the
figures as markdown tables (with the GPU's and the latencies', gpu_flatness.py and latency_flatness.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.soak import gpu_flatness, latency_flatness
from loadtest.soak.bus_samples import BusSample, StreamSample
from loadtest.soak.gpu_samples import GpuSample
from loadtest.soak.process_samples import ProcessSample
from messages.streams import REQUESTS_STREAM

MEMORY_TOLERANCE = 0.05
# The broker's memory and open files hold the streams' contents (message blocks, a per-subject index, and every
# request has subjects of its own), which grow with each request until retention removes them: it is judged by the
# streams' bounds, and its figures are reported beside the others.
STORE_PROCESSES = frozenset({"nats-server"})


@dataclass(frozen=True, slots=True)
class Moment:
    """Everything sampled at one quiet moment, and the mesh's own counts of what it held then (all 0); `gpu` None
    where the GPU was not sampled."""

    processes: dict[str, ProcessSample]
    bus: BusSample
    held: dict[str, float]
    gpu: GpuSample | None = None

    def to_dict(self) -> dict:
        return {"processes": {name: sample.to_dict() for name, sample in self.processes.items()},
                "bus": self.bus.to_dict(), "held": self.held,
                "gpu": None if self.gpu is None else self.gpu.to_dict()}


def process_verdicts(start: Moment, end: Moment) -> list[dict]:
    """Per process present at both moments: the figures and whether each is flat."""
    verdicts = []
    for name in sorted(start.processes.keys() & end.processes.keys()):
        first, last = start.processes[name], end.processes[name]
        change = (last.rss_bytes - first.rss_bytes) / first.rss_bytes
        holds_streams = name in STORE_PROCESSES
        verdicts.append({"process": name, "holds_streams": holds_streams, "rss_start": first.rss_bytes,
                         "rss_end": last.rss_bytes, "rss_change": change,
                         "memory_flat": abs(change) <= MEMORY_TOLERANCE,
                         "fds_start": first.fds, "fds_end": last.fds, "fds_equal": first.fds == last.fds,
                         "threads_start": first.threads, "threads_end": last.threads,
                         "threads_equal": first.threads == last.threads,
                         "same_pid": first.pid == last.pid})
    return verdicts


def stream_verdicts(start: Moment, end: Moment, requests: int) -> list[dict]:
    """Per stream: sizes at both moments, growth per request served between them, and whether it is bounded: a
    work queue empty at a quiet moment, any other stream holding nothing older than its retention."""
    before = {stream.name: stream for stream in start.bus.streams}
    verdicts = []
    for stream in end.bus.streams:
        first = before.get(stream.name)
        grown = stream.messages - (first.messages if first else 0)
        verdicts.append({"stream": stream.name, "messages_start": first.messages if first else 0,
                         "messages_end": stream.messages, "bytes_start": first.bytes if first else 0,
                         "bytes_end": stream.bytes, "messages_per_request": grown / requests if requests else None,
                         "oldest_age_s": stream.oldest_age_s, "max_age_s": stream.max_age_s,
                         "max_msgs": stream.max_msgs, "bounded": _is_bounded(stream)})
    return verdicts


def _is_bounded(stream: StreamSample) -> bool:
    if stream.name == REQUESTS_STREAM:
        return stream.messages == 0
    within_count = stream.max_msgs is None or stream.messages <= stream.max_msgs
    within_age = stream.max_age_s is None or stream.oldest_age_s is None or stream.oldest_age_s <= stream.max_age_s
    return within_count and within_age


def consumer_verdicts(end: Moment) -> list[dict]:
    """Per durable consumer at the end: its lag, and whether it has caught up (nothing pending or unacked)."""
    return [{"stream": c.stream, "consumer": c.name, "num_pending": c.num_pending,
             "num_ack_pending": c.num_ack_pending, "num_redelivered": c.num_redelivered,
             "caught_up": c.num_pending == 0 and c.num_ack_pending == 0} for c in end.bus.consumers]


def gpu_verdict(start: Moment, end: Moment) -> dict:
    """The GPU section: each card's and each mesh process's GPU memory within MEMORY_TOLERANCE (not judged without a
    GPU sample)."""
    return gpu_flatness.gpu_verdict(start.gpu, end.gpu, MEMORY_TOLERANCE)


def is_flat(processes: Sequence[dict], streams: Sequence[dict], consumers: Sequence[dict], *,
            requests_failed: int = 0, latency: dict | None = None, gpu: dict | None = None) -> bool:
    """Every voxmesh process flat and never restarted, the broker never restarted, every stream bounded, every
    consumer caught up; no request failed (the ones the bench cut off at its deadline aside); the latencies flat
    where judged (`latency`), the GPU's memory flat where sampled (`gpu`)."""
    return (all(p["same_pid"] and (p["holds_streams"] or (p["memory_flat"] and p["fds_equal"] and p["threads_equal"]))
                for p in processes)
            and all(s["bounded"] for s in streams) and all(c["caught_up"] for c in consumers)
            and requests_failed == 0 and (latency is None or latency["flat"])
            and (gpu is None or gpu["flat"] is not False))


def markdown(document: dict) -> str:
    """The soak's figures as the tables the README's reliability section quotes."""
    run = document["run"]
    load = run.get("load") or f"closed loop x{run['concurrency']}"
    frames = ("the length the bench's flags pick" if run["fixed_frames"] is None
              else f"{run['fixed_frames']} frames a request")
    warmup_failed = run.get("warmup_requests_failed", 0)
    lines = [f"Soak of {run['date']} ({run['commit']}): `{run['command']}`", "",
             f"{run['duration_s']:.0f} s under `voxmesh bench` ({load}, {frames}) after {run['warmup_s']:.0f} s "
             f"of warm-up: {run['requests_completed']} requests completed, {run['requests_failed']} failed "
             f"({run['requests_cut_off']} more cut off when the bench's time ran out; {warmup_failed} failed in the "
             f"warm-up), "
             f"{run['requests_per_s']:.2f} requests/s, {run['audio_s_per_s']:.2f} s of audio a second "
             f"on {run['machine']}. Verdict: **{'flat' if document['flat'] else 'NOT flat'}**.", "",
             "| process | resident memory start -> end | change | descriptors | threads |", "|---|---|---|---|---|"]
    for p in document["processes"]:
        note = " (holds the streams)" if p["holds_streams"] else "" if p["memory_flat"] else " (over 5%)"
        lines.append(f"| {p['process']} | {_mib(p['rss_start'])} -> {_mib(p['rss_end'])} | "
                     f"{p['rss_change']:+.1%}{note} | "
                     f"{p['fds_start']} -> {p['fds_end']} | {p['threads_start']} -> {p['threads_end']} |")
    lines += ["", "| stream | messages start -> end | bytes start -> end | messages per request | oldest / "
                  "retention | bounded |", "|---|---|---|---|---|---|"]
    for s in document["streams"]:
        per = "-" if s["messages_per_request"] is None else f"{s['messages_per_request']:.1f}"
        lines.append(f"| {s['stream']} | {s['messages_start']} -> {s['messages_end']} | {_mib(s['bytes_start'])} "
                     f"-> {_mib(s['bytes_end'])} | {per} | {_age(s['oldest_age_s'])} / {_age(s['max_age_s'])} | "
                     f"{'yes' if s['bounded'] else 'NO'} |")
    lines += ["", "| consumer | pending | ack pending | redelivered |", "|---|---|---|---|"]
    for c in document["consumers"]:
        lines.append(f"| {c['stream']} {c['consumer']} | {c['num_pending']} | {c['num_ack_pending']} | "
                     f"{c['num_redelivered']} |")
    if "gpu" in document:
        lines += ["", *gpu_flatness.markdown_lines(document["gpu"])]
    if "latency" in document:
        lines += ["", *latency_flatness.markdown_lines(document["latency"])]
    return "\n".join(lines) + "\n"


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.0f} h" if seconds >= 3600 else f"{seconds:.0f} s"
