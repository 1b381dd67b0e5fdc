"""Usage records made from terminal events, and summed per UTC day, tenant and model over a time range."""

from __future__ import annotations

import pytest

from messages import Accepted, Failed, Finished, Usage
from messages.errors import ErrorCode, Stage
from messages.usage import UsageRecord
from services.cli.usage import usage_table
from services.usage.record import usage_record
from services.usage.totals import (UsageQuery, UsageQueryError, grand_total, month_start, parse_time, usage_rows,
                                   utc_day)

JAN_31 = parse_time("2026-01-31")
FEB_1 = parse_time("2026-02-01")


def accepted(request_id: str, tenant: str = "acme", chars: int = 11) -> Accepted:
    return Accepted(request_id=request_id, at=JAN_31, model="tiny", seed=1, text_chars=chars, tenant=tenant)


def record(request_id: str, at: float, tenant: str = "acme", model: str = "tiny", chars: int = 10,
           seconds: float = 1.0, failed: bool = False) -> UsageRecord:
    return UsageRecord(request_id=request_id, at=at, tenant=tenant, model=model, characters=chars,
                       audio_seconds=seconds, outcome="failed" if failed else "finished",
                       code="replica_lost" if failed else None)


def test_a_finished_request_counts_its_audio_and_its_accepted_tenant_model_and_characters():
    finished = Finished(request_id="r1", at=JAN_31 + 5, frames=25, audio_seconds=2.0, chunk_count=3,
                        usage=Usage(input_chars=99))
    made = usage_record(finished, accepted("r1"))
    assert (made.request_id, made.at, made.tenant, made.model, made.characters) == ("r1", JAN_31 + 5, "acme",
                                                                                    "tiny", 11)
    assert (made.audio_seconds, made.outcome, made.code) == (2.0, "finished", None)


def test_a_request_failed_mid_stream_counts_the_audio_sent_before_and_one_error():
    failed = Failed(request_id="r2", at=JAN_31, stage=Stage.DECODE, code=ErrorCode.REPLICA_LOST, reason="gone",
                    frames=25, chunk_count=5)
    made = usage_record(failed, accepted("r2"))
    assert made.audio_seconds == pytest.approx(2.0)  # 25 frames at 12.5 frames a second
    assert (made.outcome, made.code) == ("failed", "replica_lost")


def test_without_its_accepted_event_a_record_has_no_tenant_or_model_and_decode_s_character_count():
    finished = Finished(request_id="r3", at=JAN_31, frames=1, audio_seconds=0.08, chunk_count=1,
                        usage=Usage(input_chars=7))
    made = usage_record(finished, None)
    assert (made.tenant, made.model, made.characters) == ("", "", 7)
    failed = Failed(request_id="r4", at=JAN_31, stage=Stage.GATEWAY, code=ErrorCode.TIMEOUT, reason="late")
    assert usage_record(failed, None).characters == 0


def test_rows_sum_per_utc_day_tenant_and_model_and_the_total_sums_the_rows():
    records = [record("a", JAN_31 + 10, chars=4, seconds=1.5), record("b", JAN_31 + 86399, chars=6, seconds=0.5,
                                                                      failed=True),
               record("c", FEB_1 + 1, chars=1), record("d", JAN_31 + 20, tenant="", chars=2, seconds=0.25),
               record("e", JAN_31 + 30, model="other", chars=3)]
    rows = usage_rows(records, UsageQuery(JAN_31, FEB_1 + 86400))
    assert [(r.day, r.tenant, r.model, r.requests, r.characters, r.audio_seconds, r.errors) for r in rows] == [
        ("2026-01-31", "", "tiny", 1, 2, 0.25, 0),
        ("2026-01-31", "acme", "other", 1, 3, 1.0, 0),
        ("2026-01-31", "acme", "tiny", 2, 10, 2.0, 1),
        ("2026-02-01", "acme", "tiny", 1, 1, 1.0, 0),
    ]
    total = grand_total(rows)
    assert (total.requests, total.characters, total.audio_seconds, total.errors) == (5, 16, 4.25, 1)


def test_the_range_is_half_open_and_a_tenant_or_model_narrows_it():
    records = [record("before", JAN_31 - 1), record("first", JAN_31), record("last", FEB_1 - 0.001),
               record("end", FEB_1), record("anon", JAN_31 + 1, tenant=""), record("m", JAN_31 + 2, model="big")]
    assert sum(r.requests for r in usage_rows(records, UsageQuery(JAN_31, FEB_1))) == 4
    assert [r.requests for r in usage_rows(records, UsageQuery(JAN_31, FEB_1, tenant=""))] == [1]
    assert [r.requests for r in usage_rows(records, UsageQuery(JAN_31, FEB_1, tenant="acme", model="tiny"))] == [2]
    assert [r.model for r in usage_rows(records, UsageQuery(JAN_31, FEB_1, model="big"))] == ["big"]


def test_a_request_read_twice_counts_once():
    twice = [record("same", JAN_31 + 1, seconds=3.0), record("same", JAN_31 + 1, seconds=3.0)]
    assert [(r.requests, r.audio_seconds) for r in usage_rows(twice, UsageQuery(JAN_31, FEB_1))] == [(1, 3.0)]


def test_times_parse_as_utc_and_a_bad_or_empty_range_is_refused():
    assert parse_time("2026-01-31T12:00:00Z") == JAN_31 + 12 * 3600
    assert parse_time("2026-01-31T12:00:00") == JAN_31 + 12 * 3600
    assert parse_time("2026-01-31T13:00:00+01:00") == JAN_31 + 12 * 3600
    assert utc_day(FEB_1 - 1) == "2026-01-31" and utc_day(FEB_1) == "2026-02-01"
    assert month_start(FEB_1 + 20 * 86400 + 5) == FEB_1
    with pytest.raises(UsageQueryError) as refused:
        parse_time("yesterday")
    assert refused.value.code == ErrorCode.INVALID_VALUE
    with pytest.raises(UsageQueryError):
        UsageQuery(FEB_1, JAN_31)


def test_the_cli_table_names_the_anonymous_tenant_and_ends_with_the_total():
    rows = usage_rows([record("a", JAN_31, tenant="", seconds=1.234), record("b", JAN_31, model="")],
                      UsageQuery(JAN_31, FEB_1))
    table = usage_table({"rows": [r.as_dict() for r in rows], "total": grand_total(rows).as_dict()}).splitlines()
    assert table[0].split() == ["day", "tenant", "model", "requests", "characters", "audio", "seconds", "errors"]
    assert table[1].split() == ["2026-01-31", "(anonymous)", "tiny", "1", "10", "1.23", "0"]
    assert table[2].split() == ["2026-01-31", "acme", "(unknown)", "1", "10", "1.00", "0"]
    assert table[3].split() == ["total", "*", "*", "2", "20", "2.23", "0"]
