"""The first-packet stage breakdown (loadtest/bench/stages.py): stages from a client's timeline and the mesh's
event times, the events read back from a real EVENTS stream, and the CLI's refusal of a bad events URL."""

from __future__ import annotations

import argparse

import pytest

from loadtest.bench.client import redacted
from loadtest.bench.metrics import ChunkArrival, StreamRecord
from loadtest.bench.stages import STAGES, events_mark, level_stages, read_marks, stage_seconds
from messages import encode, subjects
from messages.events import Accepted, FirstAudio, FirstFrame, Finished, Started
from messages.streams import EVENTS_STREAM, BusConfig
from services.bus.connection import connect
from services.cli import bench as bench_cli
from tests.support.nats_server import fresh_bus

OFFSET = 1_000.0
"""Unix time = the client's perf_counter + OFFSET in these records."""


def record(request_id: str, *, first_audio_at: float | None = 0.9, sent_at: float | None = 0.1) -> StreamRecord:
    chunks = (ChunkArrival(at=0.85, num_samples=0),) + (
        (ChunkArrival(at=first_audio_at, num_samples=480), ChunkArrival(at=1.5, num_samples=480))
        if first_audio_at is not None else ())
    return StreamRecord(index=0, prompt_id="p", started_at=0.0, sent_at=sent_at, ended_at=2.0, chunks=chunks,
                        sample_rate=24000, request_id=request_id)


MARKS = {"accepted": OFFSET + 0.15, "started": OFFSET + 0.25, "first_frame": OFFSET + 0.45,
         "first_audio": OFFSET + 0.8}


def test_the_stages_run_from_the_clients_start_to_its_first_audio_and_add_up_to_the_first_packet():
    stages = stage_seconds(record("a"), MARKS, OFFSET)
    assert list(stages) == list(STAGES)
    expected = {"connect": 0.1, "submit": 0.05, "queue": 0.1, "first_frame": 0.2, "first_audio": 0.35,
                "delivery": 0.1}  # the empty chunk at 0.85 is not the first audio
    assert stages == pytest.approx(expected)
    assert sum(stages.values()) == pytest.approx(0.9)


@pytest.mark.parametrize("missing", ["accepted", "started", "first_frame", "first_audio"])
def test_a_request_missing_an_event_has_no_stages(missing):
    marks = {name: at for name, at in MARKS.items() if name != missing}
    assert stage_seconds(record("a"), marks, OFFSET) is None


def test_a_request_without_audio_or_never_sent_has_no_stages():
    assert stage_seconds(record("a", first_audio_at=None), MARKS, OFFSET) is None
    assert stage_seconds(record("a", sent_at=None), MARKS, OFFSET) is None


def test_a_level_summarizes_the_requests_whose_stages_are_known():
    later = {name: at + 0.1 for name, at in MARKS.items()}
    later["first_audio"] = MARKS["first_audio"] + 0.05  # first_audio 0.3 s, delivery 0.05 s: 0.9 s in all
    summary = level_stages([record("a"), record("b"), record("c")], {"a": MARKS, "b": later}, OFFSET)
    assert summary["num_requests"] == 2 and set(summary["by_request"]) == {"a", "b"}
    assert summary["queue"]["count"] == 2 and summary["first_audio"]["min"] == pytest.approx(0.3)
    assert summary["submit"]["max"] == pytest.approx(0.15) and summary["delivery"]["mean"] == pytest.approx(0.075)
    assert level_stages([record("c")], {"a": MARKS}, OFFSET) is None


async def test_the_runs_events_are_read_back_from_the_stream_first_of_each_kind(nats_server):
    nc = await connect(nats_server.url, "stages-test", initial_timeout_s=10.0)
    try:
        js = nc.jetstream()
        await fresh_bus(js, BusConfig(models=("tiny",), storage="memory"))

        async def emit(event) -> None:
            await js.publish(subjects.event(event.request_id, event.KIND), encode(event), stream=EVENTS_STREAM)

        await emit(Accepted(request_id="before", at=1.0, model="tiny", seed=0, text_chars=3))
        mark = await events_mark(js)
        await emit(Accepted(request_id="a", at=10.0, model="tiny", seed=0, text_chars=3))
        await emit(Started(request_id="a", at=11.0, replica="d1", epoch=1))
        await emit(Started(request_id="a", at=15.0, replica="d2", epoch=2))  # migrated: the first one counts
        await emit(FirstFrame(request_id="a", at=12.0, replica="d1"))
        await emit(Accepted(request_id="other", at=10.5, model="tiny", seed=0, text_chars=3))
        await emit(FirstAudio(request_id="a", at=13.0, replica="v1"))
        await emit(Finished(request_id="a", at=14.0, frames=4, audio_seconds=0.32, chunk_count=2, stop="length"))
        await js.publish(subjects.event("a", "garbled"), b"\xc1 not an event", stream=EVENTS_STREAM)
        marks = await read_marks(js, mark, ["a", "before"])
        assert marks == {"a": {"accepted": 10.0, "started": 11.0, "first_frame": 12.0, "first_audio": 13.0}}
        assert await read_marks(js, await events_mark(js), ["a"]) == {}  # nothing stored since
    finally:
        await nc.close()


@pytest.mark.parametrize(("args", "code"), [
    (["--events-url", "http://127.0.0.1:4222"], "invalid_url"),
    (["--events-url", "nats://10.1.2.3:4222"], "not_loopback"),
    (["--compare-events-url", "nats://127.0.0.1:4222"], "invalid_load"),
])
def test_the_cli_refuses_a_bad_events_url_before_sending_anything(capsys, args, code):
    assert bench_cli.main(["--url", "http://127.0.0.1:1", "--warmup", "0", *args]) == 2
    assert f"voxmesh bench: {code}: " in capsys.readouterr().err


def test_a_password_in_an_events_url_stays_out_of_the_document():
    assert redacted("nats://observer:s3cret@127.0.0.1:4222") == "nats://observer:***@127.0.0.1:4222"
    assert redacted("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert redacted("--events-url=tls://o:p%40w@[::1]:4222") == "--events-url=tls://o:***@[::1]:4222"
    parser = argparse.ArgumentParser()
    bench_cli.configure(parser)
    args = parser.parse_args(["--url", "http://127.0.0.1:1", "--events-url", "nats://observer:s3cret@127.0.0.1:4222"])
    config = bench_cli.build_config(args)
    assert config.events_urls[0] == "nats://observer:s3cret@127.0.0.1:4222", "the bench itself connects with it"
    assert config.to_dict()["events_urls"] == ["nats://observer:***@127.0.0.1:4222"]
