"""`loadtest.bus.idle_intake` measures what it says on a real nats-server: every request taken by one of the racing
intakes, its latency, and the rounds and censuses the intakes spent per request."""

from __future__ import annotations

import json

import pytest

from loadtest.bus import idle_intake


def test_the_tool_writes_each_requests_wait_and_the_intakes_rounds(tmp_path):
    out = tmp_path / "idle.json"
    assert idle_intake.main(["--out", str(out), "--requests", "8", "--gap-ms", "5", "--replicas", "2"]) == 0
    document = json.loads(out.read_text())
    assert document["requests"] == 8 and document["replicas"] == 2
    taken = document["taken_ms"]
    assert 0 < taken["p50"] <= taken["p90"] <= taken["p99"] < idle_intake.TAKE_TIMEOUT_S * 1000
    # Each request costs the intakes at least one round between them, and a round at most one census.
    assert 0 < document["rounds_per_request"]
    assert 0 <= document["censuses_per_request"] <= document["rounds_per_request"]
    assert document["commit"] and document["machine"]["cpus"] >= 1


def test_bad_bounds_are_refused_naming_them(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        idle_intake.main(["--out", str(tmp_path / "x.json"), "--requests", "0"])
    assert refused.value.code == 2
    assert "--requests and --replicas must be >= 1" in capsys.readouterr().err
