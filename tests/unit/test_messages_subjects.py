"""Subjects, keys and stream specifications: one place, no dots from user data."""

from __future__ import annotations

import pytest

from messages import subjects, streams
from messages.errors import InvalidConfig, InvalidToken


def test_slug_makes_one_token() -> None:
    assert subjects.slug("Qwen3-TTS-0.6B") == "qwen3-tts-0_6b"
    assert subjects.slug("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") == "qwen-qwen3-tts-12hz-0_6b-customvoice"
    assert subjects.slug("a b*c>d") == "a-b-c-d"
    with pytest.raises(InvalidToken):
        subjects.slug("/ *")


def test_subject_builders() -> None:
    assert subjects.request("Qwen3-TTS-0.6B") == "tts.req.qwen3-tts-0_6b"
    assert subjects.codes(3, "abc") == "tts.codes.3.abc"
    assert subjects.audio("abc") == "tts.audio.abc"
    assert subjects.event("abc", "started") == "tts.events.abc.started"
    assert subjects.terminal("abc") == "tts.events.abc.terminal"
    assert subjects.owner_key("abc") == "owner.abc"
    assert subjects.cancel_key("abc") == "cancel.abc"
    assert subjects.lease_key("decode-a") == "lease.decode-a"
    assert subjects.partition_key(2) == "part.2"
    assert subjects.kv_transfer("prefill-1") == "tts.kvxfer.prefill-1"
    assert subjects.micro_ping() == "$SRV.PING"
    assert subjects.micro_ping_instance("voxmesh-decode", "ABC123") == "$SRV.PING.voxmesh-decode.ABC123"
    assert subjects.micro_info() == "$SRV.INFO"
    assert subjects.micro_info("voxmesh-vocoder") == "$SRV.INFO.voxmesh-vocoder"
    assert subjects.micro_stats() == "$SRV.STATS"
    assert subjects.micro_stats("voxmesh-decode") == "$SRV.STATS.voxmesh-decode"
    assert subjects.mtp_step("mtp-a") == "tts.mtp.mtp-a.step"
    assert subjects.all_mtp_steps() == "tts.mtp.*.step"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", "a>", "a b", "x" * 129])
def test_ids_with_subject_syntax_are_refused(bad: str) -> None:
    with pytest.raises(InvalidToken):
        subjects.audio(bad)


def test_partition_is_stable_and_in_range() -> None:
    found = {subjects.partition_for(f"req-{i}", 4) for i in range(64)}
    assert found == {0, 1, 2, 3}
    assert subjects.partition_for("req-1", 4) == subjects.partition_for("req-1", 4)
    with pytest.raises(InvalidToken):
        subjects.codes(-1, "abc")


def test_bus_config_specs_follow_the_design() -> None:
    config = streams.BusConfig(models=("tiny", "Qwen3-TTS-0.6B"), num_partitions=2, max_queued_requests=8)
    by_name = {s.name: s for s in config.streams()}
    requests = by_name[streams.REQUESTS_STREAM]
    assert (requests.retention, requests.discard, requests.max_msgs) == ("workqueue", "new", 8)
    assert by_name[streams.EVENTS_STREAM].max_age_s == 24 * 3600
    assert by_name[streams.CODES_STREAM].retention == "limits"
    durables = {c.durable: c for c in config.consumers()}
    lanes = {f"decode-{m}-{p}-{n}" for m in ("tiny", "qwen3-tts-0_6b") for p in ("interactive", "batch")
             for n in range(subjects.TENANT_LANES)}
    assert set(durables) == {"decode-tiny", "decode-qwen3-tts-0_6b", "prefill-tiny", "prefill-qwen3-tts-0_6b",
                             "vocoder-p0", "vocoder-p1", "usage"} | lanes
    assert durables["decode-tiny"].max_deliver == 3
    # every gateway shares one consumer of terminal events, never given up on; the records outlive EVENTS
    usage = durables[streams.USAGE_CONSUMER]
    assert (usage.stream, usage.filter_subjects, usage.max_deliver) == (streams.EVENTS_STREAM,
                                                                        (subjects.all_terminals(),), -1)
    assert (by_name[streams.USAGE_STREAM].subjects, by_name[streams.USAGE_STREAM].max_age_s) == (
        (subjects.all_usage(),), 35 * 24 * 3600)
    # decode's one consumer takes requests and prefilled hand-offs; prefill's, the prefill queue: disjoint subjects
    assert durables["decode-tiny"].filter_subjects == (subjects.request("tiny"), subjects.handoff_queue("tiny"))
    assert durables["prefill-tiny"].filter_subjects == (subjects.prefill_request("tiny"),)
    assert durables["decode-tiny-batch-3"].filter_subjects == ("tts.req.tiny.batch.3",)
    # a work queue refuses overlapping consumers: every subject is some one consumer's
    request_filters = [f for c in config.consumers() if c.stream == streams.REQUESTS_STREAM for f in c.filter_subjects]
    assert len(request_filters) == len(set(request_filters))
    assert config.bucket().name == "voxmesh"


def test_a_tenant_keeps_one_lane_per_priority() -> None:
    lane = subjects.tenant_lane("acme")
    assert lane == subjects.tenant_lane("acme") and 0 <= lane < subjects.TENANT_LANES
    assert subjects.request_for("tiny", "batch", "acme") == f"tts.req.tiny.batch.{lane}"
    assert len({subjects.tenant_lane(f"key-{i}") for i in range(64)}) == subjects.TENANT_LANES
    for bad in ({"priority": "urgent"}, {"lane": subjects.TENANT_LANES}, {"lane": -1}):
        with pytest.raises(InvalidToken):
            subjects.request_lane("tiny", bad.get("priority", "batch"), bad.get("lane", 0))


@pytest.mark.parametrize("kwargs", [{"models": ()}, {"num_partitions": 0}, {"max_queued_requests": 0},
                                    {"models": ("A.b", "a_b")}, {"duplicate_window_s": 1e9},
                                    {"usage_max_age_s": 3600.0}])
def test_bad_bus_config_is_refused(kwargs: dict) -> None:
    with pytest.raises(InvalidConfig):
        streams.BusConfig(**kwargs)
