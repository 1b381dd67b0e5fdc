"""The bus benchmarks' pure rules: the stream shape follows decode's chunk rule, subjects are classed without their
data tokens, percentiles are measured values, and the load sweep stops where the brief says."""

from __future__ import annotations

import pytest

from loadtest.bus.bus_load import planned_levels, stop_reason
from loadtest.bus.latency import percentile, ratios, summary
from loadtest.bus.replication_bench import first_packets
from loadtest.bus.stream_shape import StreamShape
from loadtest.bus.subject_census import subject_class
from messages import subjects
from services.decode.codes_stream import ChunkRule
from services.decode.settings import DecodeSettings


def test_the_stream_shape_follows_decodes_default_chunk_rule() -> None:
    defaults = DecodeSettings()
    rule = ChunkRule(defaults.initial_chunk_frames, defaults.chunk_frames)
    shape = StreamShape(frames=100)
    assert [shape.chunk_size(seq) for seq in range(12)] == [rule.size(seq) for seq in range(12)]
    assert sum(shape.chunk_sizes()) == 100 and shape.chunk_sizes()[:5] == [2, 2, 4, 8, 8]
    assert shape.audio_bytes(1) == 3840 and shape.seconds == 8.0


def test_subjects_are_classed_without_their_ids() -> None:
    assert subject_class(subjects.codes(3, "req-1")) == subject_class(subjects.codes(0, "other"))
    assert subject_class(subjects.audio("req-1")) == subjects.AUDIO_ROOT
    assert subject_class(subjects.terminal("req-1")) == f"{subjects.EVENTS_ROOT}.{subjects.TERMINAL_KIND}"
    assert subject_class(subjects.consumer_next("CODES", "vocoder-p0")) == subject_class(
        subjects.consumer_next("REQUESTS", "decode-tiny"))
    assert subject_class("_INBOX.abc.7") == "_INBOX"


def test_percentiles_are_measured_values_and_ratios_skip_an_empty_baseline() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    assert summary([]) == {"n": 0}
    assert ratios({"p50": 2.0, "p95": 4.0, "p99": 6.0}, {"p50": 1.0, "p95": 2.0, "p99": 3.0}) == \
        {"p50": 2.0, "p95": 2.0, "p99": 2.0}
    assert ratios({"p50": 2.0}, {"n": 0}) == {"p50": None, "p95": None, "p99": None}


def _level(p99: float, lag_p99: float = 1.0) -> dict:
    return {"latency_ms": {"codes_append": {"p99": p99}, "generator_lag": {"p99": lag_p99}}}


def test_the_sweep_stops_at_twice_the_lowest_p99_or_a_lagging_generator() -> None:
    assert planned_levels(16, 100) == [16, 32, 64]
    assert stop_reason(_level(3.9), 2.0) is None
    assert "p99" in stop_reason(_level(4.0), 2.0)
    assert "generator" in stop_reason(_level(1.0, lag_p99=500.0), 2.0)


def test_first_packets_pool_every_level_and_give_the_ratio() -> None:
    def target(label: str, seconds: list[float]) -> dict:
        return {"label": label, "levels": [{"requests": [{"first_packet_s": s, "ok": True} for s in seconds]}]}

    found = first_packets({"targets": [target("R1", [0.1, 0.2]), target("R3", [0.2, 0.4])]})
    assert found["first_packet_ms"]["R1"]["n"] == 2
    assert found["ratio_r3_over_r1"]["p50"] == 2.0


async def test_the_census_counts_a_consumers_delivery_apart_from_the_publish() -> None:
    from nats.aio.msg import Msg

    from loadtest.bus.subject_census import Census

    census = Census()
    subject = subjects.codes(0, "req-1")
    await census._count(Msg(None, subject=subject, reply="_INBOX.a.b", data=b"12345"))
    await census._count(Msg(None, subject=subject, reply=subjects.delivery_ack_prefix() + "CODES.vocoder-p0.1.1.1.1.0", data=b"12345"))
    await census._count(Msg(None, subject=subjects.terminal("req-1"), data=b"xy"))
    codes = subjects.CODES_ROOT
    assert census.messages == {codes: 1, f"{codes} delivered": 1, subject_class(subjects.terminal("req-1")): 1}
    assert census.bytes[codes] == 5 and census.requests == 1
